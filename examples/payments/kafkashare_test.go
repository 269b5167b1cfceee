package main

import (
	"fmt"
	"os"
	"path/filepath"
	"sync"
	"testing"

	"github.com/idemq/idemq/internal/servicetest"
)

// shareBuild is the payments service built with kafka+share:// linked in.
var shareBuild struct {
	once sync.Once
	bin  string
	err  error
}

// shareServiceBinary builds the payments service with the Kafka
// share-group source linked in. That source is a module of its own, which
// this one does not require: the build joins the two in a temporary
// workspace (go.work) and adds the one import through an overlay, so the
// checkout and both modules' go.mod stay as they are.
func shareServiceBinary(t testing.TB) string {
	t.Helper()
	dir := filepath.Dir(serviceBinary(t)) // removed by TestMain
	shareBuild.once.Do(func() {
		root, err := filepath.Abs(filepath.Join("..", ".."))
		if err != nil {
			shareBuild.err = err
			return
		}
		work := filepath.Join(dir, "go.work")
		link := filepath.Join(dir, "kafkashare_link.go")
		overlay := filepath.Join(dir, "overlay.json")
		for path, text := range map[string]string{
			work:    fmt.Sprintf("go 1.26.0\n\nuse (\n\t%s\n\t%s\n)\n", root, filepath.Join(root, "brokers", "kafkashare")),
			link:    "package main\n\nimport _ \"github.com/idemq/idemq/brokers/kafkashare\"\n",
			overlay: fmt.Sprintf(`{"Replace": {%q: %q}}`, filepath.Join(root, "examples", "payments", "kafkashare_link.go"), link),
		} {
			if shareBuild.err = os.WriteFile(path, []byte(text), 0o644); shareBuild.err != nil {
				return
			}
		}
		shareBuild.bin = filepath.Join(dir, "payments-share")
		if err := goBuild(shareBuild.bin, []string{"GOWORK=" + work}, "-overlay", overlay); err != nil {
			shareBuild.err = fmt.Errorf("with kafka+share://: %w", err)
		}
	})
	if shareBuild.err != nil {
		t.Fatal(shareBuild.err)
	}
	return shareBuild.bin
}

// TestKillAndRestartKafkaSharePostgres kills the service three times while
// it consumes a three-partition topic in a Kafka share group (kfake; records
// locked for 3s). What a killed run held comes back once its lock lapses,
// to be decided Duplicate or applied once.
func TestKillAndRestartKafkaSharePostgres(t *testing.T) {
	t.Parallel()
	store, prefix, l := postgresStore(t)
	topic := "payments-" + randomHex(4)
	addrs := servicetest.StartKfake(t, "-brokers", "1", "-auto-create=false", "-topics", topic+":3,"+topic+".dlq:1",
		"-config", "group.share.record.lock.duration.ms=3000",
		"-config", "share.record.lock.sweep.interval.ms=100",
		"-config", "group.share.heartbeat.interval.ms=500",
		"-config", "group.share.session.timeout.ms=6000")
	runKillAndRestart(t, killRun{
		broker:    "kafka+share://" + addrs + "/" + topic + "?group=payments-" + randomHex(3),
		publishTo: "kafka://" + addrs + "/" + topic + "?group=publisher",
		bin:       shareServiceBinary(t),
		store:     store, tables: prefix, ledger: l, messages: killMessages(t), duplicates: 0.2, kills: 3, batch: 20, concurrency: 2,
	})
}
