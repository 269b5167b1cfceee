package idempotency

import (
	"os/exec"
	"strings"
	"testing"
)

// TestImportsNoStoreOrDriver checks the middleware reaches a store only
// through the capabilities it asks for (driver.SQLStore and the rest):
// it links no store package and no database client.
func TestImportsNoStoreOrDriver(t *testing.T) {
	out, err := exec.Command("go", "list", "-deps", ".").Output()
	if err != nil {
		t.Fatalf("go list -deps: %v", err)
	}
	deps := strings.Fields(string(out))
	if len(deps) < 10 {
		t.Fatalf("go list -deps listed %d packages: %q", len(deps), out)
	}
	for _, p := range deps {
		for _, banned := range []string{"github.com/idemq/idemq/stores/", "github.com/jackc/", "github.com/go-sql-driver/", "modernc.org/sqlite"} {
			if strings.HasPrefix(p, banned) {
				t.Errorf("idempotency imports %s", p)
			}
		}
	}
}
