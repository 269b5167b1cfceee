package nats

import (
	"encoding/base64"
	"encoding/json"
	"fmt"
	"net/url"
	"os"
	"path/filepath"
	"testing"
	"time"

	"github.com/nats-io/nkeys"
)

// credsMode is a server in operator mode (an operator, a system account
// and an account with JetStream, preloaded in a memory resolver) and a user .creds file, the
// JWTs signed here with nkeys; a creds file of a user the account never
// signed is refused.
func credsMode(t *testing.T, dir string) securityMode {
	op, _ := nkeys.CreateOperator()
	acc, _ := nkeys.CreateAccount()
	opPub, _ := op.PublicKey()
	accPub, _ := acc.PublicKey()
	unlimited := map[string]any{"subs": -1, "data": -1, "payload": -1, "imports": -1, "exports": -1, "wildcards": true,
		"conn": -1, "leaf": -1, "mem_storage": -1, "disk_storage": -1, "streams": -1, "consumer": -1}
	opJWT := signJWT(t, op, opPub, map[string]any{"type": "operator", "version": 2})
	accJWT := signJWT(t, op, accPub, map[string]any{"type": "account", "version": 2, "limits": unlimited})
	sys, _ := nkeys.CreateAccount()
	sysPub, _ := sys.PublicKey()
	sysJWT := signJWT(t, op, sysPub, map[string]any{"type": "account", "version": 2})
	good := userCreds(t, dir, "good.creds", acc)
	stranger, _ := nkeys.CreateAccount()
	bad := userCreds(t, dir, "bad.creds", stranger)
	return securityMode{
		name: "creds",
		config: fmt.Sprintf("operator: %s\nsystem_account: %s\nresolver: MEMORY\nresolver_preload: { %s: %s, %s: %s }\n",
			opJWT, sysPub, accPub, accJWT, sysPub, sysJWT),
		good: func(u string) string { return u + "&creds=" + url.QueryEscape(good) },
		bad:  func(u string) string { return u + "&creds=" + url.QueryEscape(bad) },
	}
}

// userCreds writes a .creds file for a new user signed by acc.
func userCreds(t *testing.T, dir, name string, acc nkeys.KeyPair) string {
	user, _ := nkeys.CreateUser()
	userPub, _ := user.PublicKey()
	seed, _ := user.Seed()
	jwt := signJWT(t, acc, userPub, map[string]any{"type": "user", "version": 2, "subs": -1, "data": -1, "payload": -1})
	path := filepath.Join(dir, name)
	creds := fmt.Sprintf("-----BEGIN NATS USER JWT-----\n%s\n------END NATS USER JWT------\n\n-----BEGIN USER NKEY SEED-----\n%s\n------END USER NKEY SEED------\n", jwt, seed)
	if err := os.WriteFile(path, []byte(creds), 0o600); err != nil {
		t.Fatal(err)
	}
	return path
}

// signJWT returns a NATS JWT (alg ed25519-nkey) for subject with the nats
// claims, issued by issuer.
func signJWT(t *testing.T, issuer nkeys.KeyPair, subject string, nats map[string]any) string {
	iss, _ := issuer.PublicKey()
	enc := base64.RawURLEncoding
	header := enc.EncodeToString([]byte(`{"typ":"JWT","alg":"ed25519-nkey"}`))
	claims, err := json.Marshal(map[string]any{"jti": randomHex(16), "iat": time.Now().Unix(), "iss": iss, "sub": subject, "name": subject[:8], "nats": nats})
	if err != nil {
		t.Fatal(err)
	}
	body := header + "." + enc.EncodeToString(claims)
	sig, err := issuer.Sign([]byte(body))
	if err != nil {
		t.Fatal(err)
	}
	return body + "." + enc.EncodeToString(sig)
}
