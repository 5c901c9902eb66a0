package invoices_test

import (
	"bufio"
	"context"
	"go/parser"
	"go/token"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/require"
)

// docs/adopting.md walks a new service through adopting the outbox and the
// inbox. These tests keep it true: its shell blocks are what
// TestCopyIntoFreshModule runs, its Go snippets are whole declarations of
// the files they quote, compiled in the fresh module that test makes, and
// its SQL runs against a migrated database.

// Markers written on the line before a shell block of the guide. Every
// shell block carries one, so no command in the guide goes unrun.
const (
	markRun     = "<!-- adopt: run -->"
	markRunSqlc = "<!-- adopt: run if sqlc is installed -->"
	// The alternative copy of the write side and the relay alone, run by
	// TestCopyWriteSideAndRelay in a directory of its own.
	markSmall     = "<!-- adopt: write side and relay -->"
	markSmallSqlc = "<!-- adopt: write side and relay, if sqlc is installed -->"
)

// block is one fenced code block of the guide.
type block struct {
	lang   string // the fence's info string: sh, go, sql
	body   string
	marker string // the line before the opening fence
	source string // for go: the file named by the latest "From [`path`]" line
	line   int    // of the opening fence, for messages
}

var fromLine = regexp.MustCompile("From \\[`([^`]+)`\\]")

// repoRoot returns the directory of this module's go.mod.
func repoRoot(t *testing.T) string {
	t.Helper()
	return strings.TrimSpace(goList(t, "-m", "-f", "{{.Dir}}"))
}

// guideBlocks parses the fenced blocks of docs/adopting.md.
func guideBlocks(t *testing.T) []block {
	t.Helper()
	f, err := os.Open(filepath.Join(repoRoot(t), "docs", "adopting.md"))
	require.NoError(t, err)
	defer f.Close()
	var (
		out    []block
		cur    *block
		prev   string // the last non-blank line outside a block
		source string
		n      int
	)
	sc := bufio.NewScanner(f)
	for sc.Scan() {
		n++
		line := sc.Text()
		switch {
		case cur == nil && strings.HasPrefix(line, "```"):
			cur = &block{lang: strings.TrimPrefix(line, "```"), marker: prev, source: source, line: n}
		case cur != nil && line == "```":
			out = append(out, *cur)
			cur = nil
		case cur != nil:
			cur.body += line + "\n"
		case strings.TrimSpace(line) != "":
			prev = strings.TrimSpace(line)
			if m := fromLine.FindStringSubmatch(line); m != nil {
				source = m[1]
			}
		}
	}
	require.NoError(t, sc.Err())
	require.Nil(t, cur, "docs/adopting.md ends inside a code block")
	return out
}

// TestAdoptingGuide checks docs/adopting.md against the code.
func TestAdoptingGuide(t *testing.T) {
	t.Parallel()
	root := repoRoot(t)
	blocks := guideBlocks(t)

	t.Run("EveryShellBlockIsRun", func(t *testing.T) {
		t.Parallel()
		var n int
		for _, b := range blocks {
			if b.lang == "sh" {
				n++
				require.Contains(t, []string{markRun, markRunSqlc, markSmall, markSmallSqlc}, b.marker,
					"the shell block at line %d is not run by TestCopyIntoFreshModule or TestCopyWriteSideAndRelay; mark it", b.line)
			}
		}
		require.GreaterOrEqual(t, n, 4, "the guide's shell blocks")
	})

	t.Run("GoSnippetsAreWholeDeclarationsOfTheirFiles", func(t *testing.T) {
		t.Parallel()
		var n int
		for _, b := range blocks {
			if b.lang != "go" {
				continue
			}
			n++
			require.NotEmpty(t, b.source, "the Go block at line %d names no file it comes from", b.line)
			src, err := os.ReadFile(filepath.Join(root, b.source))
			require.NoError(t, err, "the Go block at line %d", b.line)
			checkSnippet(t, b, string(src))
		}
		require.GreaterOrEqual(t, n, 8, "the guide's Go snippets")
	})

	t.Run("SQLRuns", func(t *testing.T) {
		t.Parallel()
		pool := newDB(t)
		ctx := context.Background()
		var n int
		for _, b := range blocks {
			if b.lang != "sql" {
				continue
			}
			n++
			// Each statement runs in a transaction rolled back afterwards,
			// so that the guide's DELETE and UPDATE change nothing.
			tx, err := pool.Begin(ctx)
			require.NoError(t, err)
			_, err = tx.Exec(ctx, b.body)
			require.NoError(t, tx.Rollback(ctx))
			require.NoError(t, err, "the SQL block at line %d:\n%s", b.line, b.body)
		}
		require.GreaterOrEqual(t, n, 5, "the guide's SQL blocks")
	})

	t.Run("LinksResolve", func(t *testing.T) {
		t.Parallel()
		doc, err := os.ReadFile(filepath.Join(root, "docs", "adopting.md"))
		require.NoError(t, err)
		for _, m := range regexp.MustCompile(`\]\((\.\./[^)#]+)\)`).FindAllStringSubmatch(string(doc), -1) {
			_, err := os.Stat(filepath.Join(root, "docs", m[1]))
			require.NoError(t, err, "link %s", m[1])
		}
	})
}

// checkSnippet fails the test unless the Go block b is something a reader
// can copy as it stands: whole top-level declarations (it parses as the
// body of a file), nothing elided, and found exactly once, character for
// character, in src, the file it quotes.
func checkSnippet(t *testing.T, b block, src string) {
	t.Helper()
	require.NotContains(t, b.body, "…", "the Go block at line %d leaves something out; show the whole declaration", b.line)
	_, err := parser.ParseFile(token.NewFileSet(), b.source, "package p\n\n"+b.body, parser.ParseComments)
	require.NoError(t, err, "the Go block at line %d is not a sequence of whole declarations", b.line)
	require.Equal(t, 1, strings.Count(src, b.body),
		"the Go block at line %d is not, exactly once and as it stands, in %s:\n%s", b.line, b.source, b.body)
}

// TestCopyIntoFreshModule is the copy check (L1): it runs the shell blocks
// of docs/adopting.md, exactly as written, in an empty directory, which
// creates a fresh module, copies internal/outbox and internal/inbox into it
// with their one import-path change, adds their dependencies, and builds,
// vets and tests them there, and (where sqlc is installed) checks that
// their sqlc configurations still generate the committed code. A failure
// prints the block and everything it wrote. Then it compiles the guide's
// Go snippets against those copies (compileGuideSnippets).
func TestCopyIntoFreshModule(t *testing.T) {
	t.Parallel()
	root := repoRoot(t)
	dir := t.TempDir()
	const module = "example.com/billing"

	env := append(os.Environ(),
		"OUTBOXREF="+root,
		"MODULE="+module,
		"GOWORK=off", // a workspace around the temporary directory must not join it
		"GOFLAGS=",   // the commands run as the guide shows them
	)
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Minute)
	defer cancel()
	runGuide(ctx, t, dir, env, markRun, markRunSqlc)

	// The copy is a module of its own and names this one nowhere.
	gomod, err := os.ReadFile(filepath.Join(dir, "go.mod"))
	require.NoError(t, err)
	require.Contains(t, string(gomod), "module "+module+"\n")
	require.NoError(t, filepath.WalkDir(filepath.Join(dir, "internal"), func(path string, d os.DirEntry, err error) error {
		if err != nil || d.IsDir() {
			return err
		}
		b, err := os.ReadFile(path)
		require.NoError(t, err)
		require.NotContains(t, string(b), "github.com/outboxref/orders/", "%s still names this module", path)
		return nil
	}))
	for _, p := range []string{"internal/outbox/writer.go", "internal/inbox/inbox.go", "internal/outbox/migrations/00001_outbox.sql"} {
		require.FileExists(t, filepath.Join(dir, p))
	}

	compileGuideSnippets(ctx, t, root, dir, module, env)
}

// runGuide runs, in dir and in the guide's order, the shell blocks marked
// run, and those marked runSqlc where sqlc at the pinned version is
// installed. A failure prints the block and everything it wrote.
func runGuide(ctx context.Context, t *testing.T, dir string, env []string, run, runSqlc string) {
	t.Helper()
	sqlc := findSqlc(t)
	if sqlc != "" {
		env = append(env, "PATH="+filepath.Dir(sqlc)+string(os.PathListSeparator)+os.Getenv("PATH"))
	}
	ran := 0
	for _, b := range guideBlocks(t) {
		if b.lang != "sh" || (b.marker != run && b.marker != runSqlc) {
			continue
		}
		if b.marker == runSqlc && sqlc == "" {
			t.Logf("sqlc at the pinned version is not installed (./scripts/install-sqlc.sh installs it): skipped the block at line %d:\n%s", b.line, b.body)
			continue
		}
		start := time.Now()
		cmd := exec.CommandContext(ctx, "bash", "-euo", "pipefail", "-c", b.body)
		cmd.Dir, cmd.Env = dir, env
		out, err := cmd.CombinedOutput()
		if err != nil {
			t.Fatalf("the shell block at line %d of docs/adopting.md failed after %s: %v\n--- block ---\n%s--- output ---\n%s",
				b.line, time.Since(start).Round(time.Millisecond), err, b.body, out)
		}
		t.Logf("block at line %d: %s", b.line, time.Since(start).Round(time.Millisecond))
		ran++
	}
	require.Positive(t, ran, "no block of docs/adopting.md is marked %s", run)
}

// TestCopyWriteSideAndRelay is the smaller copy check: a service that only
// writes events and runs the relay copies the outbox without its
// operations, as docs/adopting.md shows, and that copy builds, vets and
// passes its tests in a fresh module with no other edit, its sqlc
// configuration still generating the committed code.
func TestCopyWriteSideAndRelay(t *testing.T) {
	t.Parallel()
	root := repoRoot(t)
	dir := t.TempDir()
	env := append(os.Environ(), "OUTBOXREF="+root, "MODULE=example.com/shipping", "GOWORK=off", "GOFLAGS=")
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Minute)
	defer cancel()
	runGuide(ctx, t, dir, env, markSmall, markSmallSqlc)
	for _, gone := range []string{"operate", "problem", "adminguard"} {
		require.NoDirExists(t, filepath.Join(dir, "internal", "outbox", gone))
	}
	require.DirExists(t, filepath.Join(dir, "internal", "outbox", "relay"))
}

// compileGuideSnippets compiles the Go blocks of docs/adopting.md in the
// fresh module dir, against its copies of the outbox and the inbox. The
// blocks are declarations of examples/invoices, whose other declarations
// (Config, the defaults, input checks) they need, so the example is copied
// to internal/invoices with this module's import paths changed to the
// fresh one's; each block is then cut out of its file there, which must
// hold it exactly once, and the guide's text appended to that file in its
// place. The package builds and vets with the guide's text, or the test
// fails naming what does not compile.
func compileGuideSnippets(ctx context.Context, t *testing.T, root, dir, module string, env []string) {
	t.Helper()
	const example = "examples/invoices"
	dst := filepath.Join(dir, "internal", "invoices")
	paths := strings.NewReplacer(
		"github.com/outboxref/orders/"+example, module+"/internal/invoices",
		"github.com/outboxref/orders/internal/", module+"/internal/",
	)
	require.NoError(t, filepath.WalkDir(filepath.Join(root, example), func(path string, d os.DirEntry, err error) error {
		if err != nil || d.IsDir() || strings.HasSuffix(path, "_test.go") {
			return err
		}
		rel, err := filepath.Rel(filepath.Join(root, example), path)
		require.NoError(t, err)
		b, err := os.ReadFile(path)
		require.NoError(t, err)
		require.NoError(t, os.MkdirAll(filepath.Dir(filepath.Join(dst, rel)), 0o755))
		return os.WriteFile(filepath.Join(dst, rel), []byte(paths.Replace(string(b))), 0o644)
	}))

	files := map[string]string{} // file of the copy -> its text so far
	var n int
	for _, b := range guideBlocks(t) {
		if b.lang != "go" {
			continue
		}
		rel, ok := strings.CutPrefix(b.source, example+"/")
		require.True(t, ok, "the Go block at line %d quotes %s, not a file of %s", b.line, b.source, example)
		file := filepath.Join(dst, filepath.FromSlash(rel))
		text, seen := files[file]
		if !seen {
			raw, err := os.ReadFile(file)
			require.NoError(t, err)
			text = string(raw)
		}
		require.Equal(t, 1, strings.Count(text, b.body), "the Go block at line %d is not, exactly once, in %s", b.line, b.source)
		files[file] = strings.Replace(text, b.body, "", 1) + "\n" + b.body
		n++
	}
	require.GreaterOrEqual(t, n, 8, "the guide's Go snippets")
	for file, text := range files {
		require.NoError(t, os.WriteFile(file, []byte(text), 0o644))
	}
	for _, args := range [][]string{{"build", "./internal/invoices/..."}, {"vet", "./internal/invoices/..."}} {
		cmd := exec.CommandContext(ctx, "go", args...)
		cmd.Dir, cmd.Env = dir, env
		out, err := cmd.CombinedOutput()
		require.NoError(t, err, "go %s of the guide's Go snippets in the fresh module:\n%s", strings.Join(args, " "), out)
	}
}

// findSqlc returns the sqlc binary on PATH or in the Go bin directory
// (where scripts/install-sqlc.sh puts it), or "" when there is none at the
// version the Makefile pins: another version generates other headers, and
// the drift check would fail for that reason alone.
func findSqlc(t *testing.T) string {
	t.Helper()
	p, err := exec.LookPath("sqlc")
	if err != nil {
		gobin := strings.TrimSpace(goEnv(t, "GOBIN"))
		if gobin == "" {
			gobin = filepath.Join(filepath.SplitList(strings.TrimSpace(goEnv(t, "GOPATH")))[0], "bin")
		}
		p = filepath.Join(gobin, "sqlc")
		if _, err := os.Stat(p); err != nil {
			return ""
		}
	}
	makefile, err := os.ReadFile(filepath.Join(repoRoot(t), "Makefile"))
	require.NoError(t, err)
	pinned := regexp.MustCompile(`(?m)^SQLC_VERSION\s*:=\s*(\S+)`).FindSubmatch(makefile)
	require.NotNil(t, pinned, "SQLC_VERSION in the Makefile")
	out, err := exec.Command(p, "version").Output()
	if got := strings.TrimSpace(string(out)); err != nil || got != string(pinned[1]) {
		t.Logf("%s is sqlc %q, not the pinned %s", p, got, pinned[1])
		return ""
	}
	return p
}

func goEnv(t *testing.T, name string) string {
	t.Helper()
	out, err := exec.Command("go", "env", name).Output()
	require.NoError(t, err, "go env %s", name)
	return string(out)
}
