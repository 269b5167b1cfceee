package docstest

import (
	"go/ast"
	"go/parser"
	"go/token"
	"os/exec"
	"path/filepath"
	"regexp"
	"strings"
	"testing"
)

// sourceNames are the sources every list of them names.
var sourceNames = []string{"RabbitMQ", "Kafka", "share groups", "SQS", "Google Cloud Pub/Sub", "NATS JetStream", "Redis Streams", "webhooks"}

// oneLine is text with every run of white space made one space, so a name
// wrapped across lines still matches.
func oneLine(text string) string { return strings.Join(strings.Fields(text), " ") }

// TestListsNameEverySource checks the README's opening paragraph and the
// guides' index name every source.
func TestListsNameEverySource(t *testing.T) {
	root := repoRoot(t)
	readme, _, _ := strings.Cut(readFile(t, filepath.Join(root, "README.md")), "\n\n```")
	opening, _, _ := strings.Cut(strings.SplitN(readme, "\n\n", 3)[1], "\n\n")
	index := readFile(t, filepath.Join(root, "docs", "README.md"))
	for _, c := range []struct{ where, text string }{{"README.md's opening paragraph", opening}, {"docs/README.md", index}} {
		text := strings.ToLower(oneLine(c.text))
		for _, name := range sourceNames {
			if !strings.Contains(text, strings.ToLower(name)) {
				t.Errorf("%s does not name %s:\n%s", c.where, name, c.text)
			}
		}
	}
}

// TestConsumerGuideNamesEveryOption checks docs/consumer.md names every
// option core exports (a func named With…).
func TestConsumerGuideNamesEveryOption(t *testing.T) {
	root := repoRoot(t)
	files, err := filepath.Glob(filepath.Join(root, "core", "*.go"))
	if err != nil {
		t.Fatal(err)
	}
	guide := readFile(t, filepath.Join(root, "docs", "consumer.md"))
	n := 0
	for _, name := range files {
		if strings.HasSuffix(name, "_test.go") {
			continue
		}
		f, err := parser.ParseFile(token.NewFileSet(), name, nil, parser.SkipObjectResolution)
		if err != nil {
			t.Fatal(err)
		}
		for _, d := range f.Decls {
			fn, ok := d.(*ast.FuncDecl)
			if !ok || fn.Recv != nil || !fn.Name.IsExported() || !strings.HasPrefix(fn.Name.Name, "With") {
				continue
			}
			n++
			if !regexp.MustCompile(`\b` + fn.Name.Name + `\b`).MatchString(guide) {
				t.Errorf("docs/consumer.md does not name the option %s", fn.Name.Name)
			}
		}
	}
	if n < 10 {
		t.Fatalf("found %d options in core, want the package's With… functions", n)
	}
}

// maxCoreDocLines bounds `go doc -short ./core`: the core package's API
// stays small enough to read at a glance.
const maxCoreDocLines = 70

// TestCoreAPISize checks `go doc -short ./core` stays within
// maxCoreDocLines.
func TestCoreAPISize(t *testing.T) {
	cmd := exec.Command("go", "doc", "-short", "./core")
	cmd.Dir = repoRoot(t)
	out, err := cmd.Output()
	if err != nil {
		t.Fatalf("go doc -short ./core: %v", err)
	}
	if n := len(lines(string(out))); n > maxCoreDocLines {
		t.Errorf("go doc -short ./core prints %d lines, at most %d: keep core's exported API small", n, maxCoreDocLines)
	}
}
