package docstest

import (
	"context"
	"fmt"
	"net/url"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"runtime"
	"strings"
	"testing"
	"time"
	"unicode"
)

// testCommand is the README's test command, byte for byte: CI greps it.
const testCommand = "go test -race github.com/idemq/idemq/..."

// maxReadmeLines bounds the front page: everything else lives in docs/.
const maxReadmeLines = 250

// repoRoot returns the module's root: the directory two levels above this
// package that holds go.mod.
func repoRoot(t *testing.T) string {
	t.Helper()
	root, err := filepath.Abs(filepath.Join("..", ".."))
	if err != nil {
		t.Fatal(err)
	}
	mod, err := os.ReadFile(filepath.Join(root, "go.mod"))
	if err != nil {
		t.Fatalf("module root: %v", err)
	}
	if !strings.HasPrefix(string(mod), "module github.com/idemq/idemq\n") {
		t.Fatalf("%s/go.mod is not the idemq module", root)
	}
	return root
}

func readFile(t *testing.T, path string) string {
	t.Helper()
	b, err := os.ReadFile(path)
	if err != nil {
		t.Fatal(err)
	}
	return string(b)
}

// lines splits text into its lines, without a last empty one after a final
// newline.
func lines(text string) []string {
	return strings.Split(strings.TrimSuffix(text, "\n"), "\n")
}

// firstGoBlock returns the body of the first ```go fenced block, found as
// .ci/usergraph finds it: a line that is ```go (trailing blanks allowed)
// opens it, the next line starting with ``` closes it.
func firstGoBlock(text string) (string, bool) {
	var body []string
	in := false
	for _, l := range lines(text) {
		switch {
		case !in && strings.TrimRight(l, " \t") == "```go":
			in = true
		case in && strings.HasPrefix(l, "```"):
			return strings.Join(body, "\n") + "\n", true
		case in:
			body = append(body, l)
		}
	}
	return "", false
}

// goCommand is the go command of the toolchain running the tests.
func goCommand(t *testing.T) string {
	t.Helper()
	exe := "go"
	if runtime.GOOS == "windows" {
		exe += ".exe"
	}
	if root := runtime.GOROOT(); root != "" {
		if p := filepath.Join(root, "bin", exe); fileExists(p) {
			return p
		}
	}
	p, err := exec.LookPath("go")
	if err != nil {
		t.Fatalf("no go command: runtime.GOROOT() is %q and go is not on PATH", runtime.GOROOT())
	}
	return p
}

func fileExists(p string) bool {
	_, err := os.Stat(p)
	return err == nil
}

// TestReadmeProgramBuilds builds the README's first Go block as a user's
// program: a main package inside this module, so that it compiles against
// this checkout's API.
func TestReadmeProgramBuilds(t *testing.T) {
	root := repoRoot(t)
	src, ok := firstGoBlock(readFile(t, filepath.Join(root, "README.md")))
	if !ok {
		t.Fatal("README.md has no ```go block")
	}
	if !strings.HasPrefix(strings.TrimSpace(src), "package main") {
		t.Fatalf("README.md's first ```go block is not a whole program: it does not start with package main")
	}
	if regexp.MustCompile(`,\s*_\s*:?=`).MatchString(src) {
		t.Errorf("README.md's first program discards a result with _; check every error")
	}

	buildProgram(t, "README.md's first Go program", src)
}

// buildProgram builds src, a whole program that what names, as a user's
// program: a main package inside this module, so that it compiles against
// this checkout's API. It returns the binary's path.
func buildProgram(t *testing.T, what, src string) string {
	t.Helper()
	pkgDir, err := os.Getwd()
	if err != nil {
		t.Fatal(err)
	}
	// A directory of this package's own, inside the module: the go command
	// builds it against the checkout. Its name starts with neither '.' nor
	// '_', which the go command would ignore.
	dir, err := os.MkdirTemp(pkgDir, "readme-")
	if err != nil {
		t.Fatal(err)
	}
	defer os.RemoveAll(dir)
	if err := os.WriteFile(filepath.Join(dir, "main.go"), []byte(src), 0o644); err != nil {
		t.Fatal(err)
	}

	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Minute)
	defer cancel()
	bin := filepath.Join(t.TempDir(), "x")
	args := []string{"build", "-buildvcs=false"}
	if raceEnabled {
		args = append(args, "-race") // reuses what the other tests compiled
	}
	args = append(args, "-o", bin, "./"+filepath.Base(dir))
	cmd := exec.CommandContext(ctx, goCommand(t), args...)
	cmd.Dir = pkgDir
	out, err := cmd.CombinedOutput()
	if err != nil {
		t.Fatalf("%s does not build (%s): %v\n%s\nthe program:\n%s",
			what, strings.Join(cmd.Args, " "), err, out, numbered(src))
	}
	return bin
}

// numbered returns src with line numbers, to read the compiler's
// positions against.
func numbered(src string) string {
	var b strings.Builder
	for i, l := range lines(src) {
		fmt.Fprintf(&b, "%4d  %s\n", i+1, l)
	}
	return b.String()
}

// TestReadmeLength keeps the front page short.
func TestReadmeLength(t *testing.T) {
	n := len(lines(readFile(t, filepath.Join(repoRoot(t), "README.md"))))
	if n > maxReadmeLines {
		t.Errorf("README.md has %d lines, at most %d: move the details into docs/", n, maxReadmeLines)
	}
}

// TestReadmeTestCommand checks the README holds the test command CI greps.
func TestReadmeTestCommand(t *testing.T) {
	if !strings.Contains(readFile(t, filepath.Join(repoRoot(t), "README.md")), testCommand) {
		t.Errorf("README.md lacks the test command %q", testCommand)
	}
}

// markdownFiles are the files whose links are checked: README.md and
// docs/*.md.
func markdownFiles(t *testing.T, root string) []string {
	t.Helper()
	docs, err := filepath.Glob(filepath.Join(root, "docs", "*.md"))
	if err != nil {
		t.Fatal(err)
	}
	return append([]string{filepath.Join(root, "README.md")}, docs...)
}

var (
	// inlineLink matches [text](target) and ![alt](target), with an
	// optional "title".
	inlineLink = regexp.MustCompile(`!?\[[^\]]*\]\(\s*<?([^)\s>]+)>?(?:\s+"[^"]*")?\s*\)`)
	// refLink matches a reference definition: [label]: target.
	refLink = regexp.MustCompile(`^\s{0,3}\[[^\]]+\]:\s*<?(\S+?)>?(?:\s+.*)?$`)
	// codeSpan matches an inline code span, whose text is not markdown.
	codeSpan = regexp.MustCompile("(`+)[^`]*?(`+)")
	// scheme matches a target with a URL scheme: not a relative link.
	scheme = regexp.MustCompile(`^[A-Za-z][A-Za-z0-9+.-]*:`)
	// heading matches an ATX heading and its text.
	heading = regexp.MustCompile(`^ {0,3}#{1,6}[ \t]+(.*?)(?:[ \t]+#+)?[ \t]*$`)
)

// fence reports whether l opens or closes a fenced code block, and the
// fence's marker.
func fence(l string) (string, bool) {
	s := strings.TrimLeft(l, " ")
	if len(l)-len(s) > 3 {
		return "", false
	}
	for _, m := range []string{"```", "~~~"} {
		if strings.HasPrefix(s, m) {
			return m, true
		}
	}
	return "", false
}

// proseLines returns the lines of text outside fenced code blocks, with
// their 1-based numbers.
func proseLines(text string) (out []string, nums []int) {
	open := ""
	for i, l := range lines(text) {
		if m, ok := fence(l); ok {
			switch {
			case open == "":
				open = m
				continue
			case m == open:
				open = ""
				continue
			}
		}
		if open == "" {
			out = append(out, l)
			nums = append(nums, i+1)
		}
	}
	return out, nums
}

// anchors returns the fragments GitHub gives the headings of a markdown
// text.
func anchors(text string) map[string]bool {
	seen := map[string]int{}
	out := map[string]bool{}
	prose, _ := proseLines(text)
	for _, l := range prose {
		m := heading.FindStringSubmatch(l)
		if m == nil {
			continue
		}
		slug := slugify(m[1])
		if n := seen[slug]; n > 0 {
			out[fmt.Sprintf("%s-%d", slug, n)] = true
		} else {
			out[slug] = true
		}
		seen[slug]++
	}
	return out
}

var (
	linkText = regexp.MustCompile(`!?\[([^\]]*)\]\([^)]*\)`)
	htmlTag  = regexp.MustCompile(`<[^>]+>`)
)

// slugify turns a heading's text into its anchor as GitHub does: the text
// without markup, lowercased, every character but letters, digits, spaces,
// '-' and '_' dropped, each space turned into '-'.
func slugify(h string) string {
	h = linkText.ReplaceAllString(h, "$1")
	h = htmlTag.ReplaceAllString(h, "")
	var b strings.Builder
	for _, r := range strings.ToLower(h) {
		switch {
		case r == ' ':
			b.WriteRune('-')
		case r == '-' || r == '_' || unicode.IsLetter(r) || unicode.IsDigit(r) || unicode.Is(unicode.Mn, r):
			b.WriteRune(r)
		}
	}
	return b.String()
}

// TestRelativeLinks checks that every relative link in README.md and
// docs/*.md names a file or directory that exists, and that a #fragment
// names a heading of the markdown file it points into.
func TestRelativeLinks(t *testing.T) {
	root := repoRoot(t)
	anchorsOf := map[string]map[string]bool{}
	anchorsFor := func(path string) map[string]bool {
		if a, ok := anchorsOf[path]; ok {
			return a
		}
		a := anchors(readFile(t, path))
		anchorsOf[path] = a
		return a
	}
	checked := 0
	for _, file := range markdownFiles(t, root) {
		rel, _ := filepath.Rel(root, file)
		prose, nums := proseLines(readFile(t, file))
		for i, l := range prose {
			var targets []string
			for _, m := range inlineLink.FindAllStringSubmatch(codeSpan.ReplaceAllString(l, ""), -1) {
				targets = append(targets, m[1])
			}
			if m := refLink.FindStringSubmatch(l); m != nil {
				targets = append(targets, m[1])
			}
			for _, target := range targets {
				if scheme.MatchString(target) || strings.HasPrefix(target, "//") {
					continue // an absolute URL
				}
				checked++
				where := fmt.Sprintf("%s:%d: link %q", rel, nums[i], target)
				pathPart, frag, _ := strings.Cut(target, "#")
				p, err := url.PathUnescape(pathPart)
				if err != nil {
					t.Errorf("%s: %v", where, err)
					continue
				}
				dest := file
				if p != "" {
					dest = filepath.Join(filepath.Dir(file), filepath.FromSlash(p))
				}
				info, err := os.Stat(dest)
				if err != nil {
					t.Errorf("%s: %s does not exist", where, p)
					continue
				}
				if frag == "" {
					continue
				}
				if info.IsDir() || !strings.HasSuffix(dest, ".md") {
					t.Errorf("%s: a #fragment into %s, which is not a markdown file", where, p)
					continue
				}
				if !anchorsFor(dest)[frag] {
					t.Errorf("%s: no heading of %s has the anchor #%s", where, filepath.Base(dest), frag)
				}
			}
		}
	}
	if checked == 0 {
		t.Error("no relative link found: the link pattern is broken")
	}
}

// TestSlugify pins the anchor rules the link check relies on.
func TestSlugify(t *testing.T) {
	for h, want := range map[string]string{
		"Outages: pause, don't spin":                                  "outages-pause-dont-spin",
		"Dead letters: `idemq dlq`":                                   "dead-letters-idemq-dlq",
		"RabbitMQ: `amqp://`, `amqps://`":                             "rabbitmq-amqp-amqps",
		"Production: clusters, failover, outages and a flaky network": "production-clusters-failover-outages-and-a-flaky-network",
		"Partitions (Postgres)":                                       "partitions-postgres",
		"snake_case and-dash":                                         "snake_case-and-dash",
		"A [linked](x.md) heading":                                    "a-linked-heading",
	} {
		if got := slugify(h); got != want {
			t.Errorf("slugify(%q) = %q, want %q", h, got, want)
		}
	}
}

// TestNoStrayBuildDirs fails when a readme-* directory of an interrupted
// run is left behind (TestReadmeProgramBuilds removes its own when it
// ends; the tests of this package do not run in parallel).
func TestNoStrayBuildDirs(t *testing.T) {
	pkgDir, err := os.Getwd()
	if err != nil {
		t.Fatal(err)
	}
	entries, err := os.ReadDir(pkgDir)
	if err != nil {
		t.Fatal(err)
	}
	for _, e := range entries {
		if e.IsDir() && strings.HasPrefix(e.Name(), "readme-") {
			t.Errorf("%s is left from an interrupted run: remove it", filepath.Join(pkgDir, e.Name()))
		}
	}
}
