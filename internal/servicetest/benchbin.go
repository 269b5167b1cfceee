package servicetest

import (
	"crypto/sha256"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"runtime"
	"strings"
	"sync"
)

// benchBuilds holds one build per binary name and process.
var benchBuilds sync.Map // name → *benchBuild

type benchBuild struct {
	once sync.Once
	bin  string
	err  error
}

// BenchBinary builds pkg, a main package of the bench module or one it
// requires as a tool (bench/cmd/kfake, Toxiproxy's server), once per
// process, and returns the binary's path. The servers tests need that the
// library's module must not require are built there: a user's module graph
// never holds them. The binary goes to a directory of the user's cache
// named after the checkout and pkg, where the go command leaves it as it is
// while it is up to date: later processes do not link it again.
func BenchBinary(name, pkg string) (string, error) {
	b, _ := benchBuilds.LoadOrStore(name, &benchBuild{})
	bb := b.(*benchBuild)
	bb.once.Do(func() { bb.bin, bb.err = buildBench(name, pkg) })
	return bb.bin, bb.err
}

func buildBench(name, pkg string) (string, error) {
	dir, err := benchDir()
	if err != nil {
		return "", err
	}
	goCmd, err := exec.LookPath("go")
	if err != nil {
		return "", err
	}
	base, err := os.UserCacheDir()
	if err != nil {
		base = os.TempDir()
	}
	sum := sha256.Sum256([]byte(dir + "\x00" + pkg))
	out := filepath.Join(base, "idemq-servicetest", fmt.Sprintf("%s-%x", name, sum[:6]))
	if err := os.MkdirAll(out, 0o700); err != nil {
		return "", err
	}
	bin := filepath.Join(out, name)
	if runtime.GOOS == "windows" {
		bin += ".exe"
	}
	cmd := exec.Command(goCmd, "build", "-o", bin, pkg)
	cmd.Dir = dir
	if msg, err := cmd.CombinedOutput(); err != nil {
		return "", fmt.Errorf("go build -o %s %s in %s: %v\n%s", bin, pkg, dir, err, msg)
	}
	return bin, nil
}

// benchDir finds the bench module of this checkout.
func benchDir() (string, error) {
	return inCheckout(filepath.Join("bench", "go.mod"))
}

// inCheckout finds the directory holding rel (a file's path from the
// module root) in this checkout: beside this file's module root, or else
// beside the module root `go env GOMOD` names (when file names are trimmed
// from the binary).
func inCheckout(rel string) (string, error) {
	var roots []string
	if _, file, _, ok := runtime.Caller(0); ok && filepath.IsAbs(file) {
		roots = append(roots, filepath.Join(filepath.Dir(file), "..", ".."))
	}
	if out, err := exec.Command("go", "env", "GOMOD").Output(); err == nil {
		if mod := strings.TrimSpace(string(out)); mod != "" && mod != os.DevNull {
			roots = append(roots, filepath.Dir(mod))
		}
	}
	for _, root := range roots {
		if _, err := os.Stat(filepath.Join(root, rel)); err == nil {
			return filepath.Abs(filepath.Dir(filepath.Join(root, rel)))
		}
	}
	return "", fmt.Errorf("no %s beside the module root (looked in %s)", rel, strings.Join(roots, ", "))
}
