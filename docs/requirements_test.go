package docs

import (
	"bufio"
	"bytes"
	"errors"
	"fmt"
	"go/ast"
	"go/parser"
	"go/token"
	"io/fs"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"sort"
	"strconv"
	"strings"
	"testing"

	"github.com/stretchr/testify/require"
)

// The requirement IDs cited across the repository (comments, tests,
// documents, SQL, scripts) are defined in requirements.md. The tests in
// this file keep the two in step: a tag without a definition, or a
// definition naming a test that does not exist, fails the build with the
// file and line to fix.

// requirementsFile is the page that defines every requirement ID, relative
// to the module root.
const requirementsFile = "docs/requirements.md"

// testName is the name of a test, benchmark, fuzz target or example.
const testName = `(?:Test|Benchmark|Fuzz|Example)[A-Za-z0-9_]*`

var (
	// tagPattern finds a requirement tag: a family letter, a number and an
	// optional lower-case refinement (R5a, C4b), as a whole word. Go's \b
	// is an ASCII word boundary, so a tag inside an identifier or a longer
	// token ("W3C", "0xC3", "C3A9", "V5_x") is not one. Matches are then
	// filtered by notATag.
	tagPattern = regexp.MustCompile(`\b[WRCLOSV][0-9]+[a-z]?\b`)

	// rangePattern finds a range of one family ("R1–R9", "O4-O6"). Its ends
	// are tags like any other; the numbers between them are cited too and
	// must be defined.
	rangePattern = regexp.MustCompile(`\b([WRCLOSV])([0-9]+)\s*[-–]\s*([WRCLOSV])([0-9]+)\b`)

	// definitionPattern is one definition line of requirements.md.
	definitionPattern = regexp.MustCompile(`^- \*\*([WRCLOSV][0-9]+[a-z]?)\*\* (.+)$`)

	// c0Pattern finds Unicode's C0 control set named on a line.
	c0Pattern = regexp.MustCompile(`\bC0\b`)

	// familyPattern is the heading of a family's section.
	familyPattern = regexp.MustCompile(`^## ([WRCLOSV]): `)

	// testRefPattern is one package's tests on a definition line:
	// `internal/outbox`: `TestFencing`, `TestFencingRelease`.
	testRefPattern = regexp.MustCompile("`([a-z0-9_./-]+)`: (`[A-Za-z0-9_]+`(?:, `[A-Za-z0-9_]+`)*)")

	// testNamePattern is a code span that names a test, benchmark, fuzz
	// target or example; on a definition line each must belong to a
	// testRefPattern group, so none escapes the existence check.
	testNamePattern = regexp.MustCompile("`(" + testName + ")`")

	// testNameOnly is a whole test, benchmark, fuzz target or example name.
	testNameOnly = regexp.MustCompile("^" + testName + "$")
)

// skipFile reports whether a repository file is left out of the tag scan,
// and why each kind is.
func skipFile(path string) bool {
	switch {
	case path == "docs/requirements_test.go":
		// This file: its comments and cases hold made-up and excluded tags
		// on purpose.
		return true
	case filepath.Base(path) == "go.sum":
		// Checksums, not prose: base64 can spell anything.
		return true
	case strings.Contains("/"+path, "/testdata/"):
		// Fuzz corpora and fixtures: arbitrary bytes, not prose.
		return true
	}
	return false
}

// notATag reports whether a match of tagPattern in line, at [start, end),
// is something else that looks like a tag:
//
//   - after '%' it is URL percent-encoding ("%C3%A9" is "é", in a test's
//     query string);
//   - C0 is Unicode's C0 control set (no requirement is numbered 0), and a
//     C1 on a line that also names C0 is its companion set ("the C0 and C1
//     controls", in the admin input rule and its documentation);
//   - after "identifier." it is a selector such as a Go identifier
//     (uuid.V5), not a citation. None occurs today; the rule keeps a
//     future one from reading as a tag.
//
// A new look-alike gets its own rule here, with a case in TestTagExtraction.
func notATag(line string, start, end int) bool {
	tag := line[start:end]
	if start > 0 && line[start-1] == '%' {
		return true
	}
	if start > 1 && line[start-1] == '.' && isWordByte(line[start-2]) {
		return true
	}
	if tag == "C0" {
		return true
	}
	return tag == "C1" && c0Pattern.MatchString(line)
}

func isWordByte(b byte) bool {
	return b == '_' || '0' <= b && b <= '9' || 'a' <= b && b <= 'z' || 'A' <= b && b <= 'Z'
}

// citation is one requirement ID cited at a line of a file.
type citation struct {
	ID   string
	Path string
	Line int
	// Range is the range the ID lies inside when it is not written out
	// ("R1–R9" cites R2 to R8 this way), or empty.
	Range string
}

func (c citation) String() string {
	if c.Range != "" {
		return fmt.Sprintf("%s:%d: %s (inside the range %s)", c.Path, c.Line, c.ID, c.Range)
	}
	return fmt.Sprintf("%s:%d: %s", c.Path, c.Line, c.ID)
}

// tagsIn returns the requirement IDs a line cites, in order: each tag
// written out, then the IDs between the ends of each range.
func tagsIn(line string) (ids []string, ranges map[string]string) {
	for _, m := range tagPattern.FindAllStringIndex(line, -1) {
		if !notATag(line, m[0], m[1]) {
			ids = append(ids, line[m[0]:m[1]])
		}
	}
	for _, m := range rangePattern.FindAllStringSubmatch(line, -1) {
		if m[1] != m[3] {
			continue
		}
		lo, _ := strconv.Atoi(m[2])
		hi, _ := strconv.Atoi(m[4])
		for n := lo + 1; n < hi; n++ {
			if ranges == nil {
				ranges = map[string]string{}
			}
			id := m[1] + strconv.Itoa(n)
			ids = append(ids, id)
			ranges[id] = m[0]
		}
	}
	return ids, ranges
}

// moduleRoot is the directory holding go.mod: the parent of this package.
func moduleRoot(t *testing.T) string {
	t.Helper()
	root, err := filepath.Abs("..")
	require.NoError(t, err)
	_, err = os.Stat(filepath.Join(root, "go.mod"))
	require.NoError(t, err, "the docs package must sit directly under the module root")
	return root
}

// repositoryFiles lists the files of the repository, relative to root: the
// ones git tracks and the new ones it does not ignore, so a tag in a file
// not yet added is checked too, while build output and demo state are not.
func repositoryFiles(t *testing.T, root string) []string {
	t.Helper()
	cmd := exec.Command("git", "ls-files", "-z", "--cached", "--others", "--exclude-standard")
	cmd.Dir = root
	var stderr bytes.Buffer
	cmd.Stderr = &stderr
	out, err := cmd.Output()
	require.NoError(t, err, "list the repository's files with git (this test needs a git checkout): %s", stderr.String())
	var files []string
	seen := map[string]bool{}
	for _, f := range strings.Split(string(out), "\x00") {
		if f != "" && !seen[f] {
			seen[f] = true
			files = append(files, f)
		}
	}
	sort.Strings(files)
	require.NotEmpty(t, files)
	return files
}

// citations returns every requirement ID cited in the repository's text
// files.
func citations(t *testing.T, root string) []citation {
	t.Helper()
	var out []citation
	for _, path := range repositoryFiles(t, root) {
		if skipFile(path) {
			continue
		}
		b, err := os.ReadFile(filepath.Join(root, filepath.FromSlash(path)))
		if errors.Is(err, fs.ErrNotExist) {
			continue // deleted in the working tree, not yet in the index
		}
		require.NoError(t, err)
		if bytes.IndexByte(b[:min(len(b), 8000)], 0) >= 0 {
			continue // binary (git's own test): no prose to cite anything
		}
		for i, line := range strings.Split(string(b), "\n") {
			ids, ranges := tagsIn(line)
			for _, id := range ids {
				out = append(out, citation{ID: id, Path: path, Line: i + 1, Range: ranges[id]})
			}
		}
	}
	return out
}

// definition is one requirement of requirements.md.
type definition struct {
	ID   string
	Line int
	Text string
}

// testRef is a test that a definition names.
type testRef struct {
	Pkg  string // directory relative to the module root
	Name string
}

// readDefinitions parses requirements.md. Problems with the page itself (a
// duplicate, an ID under another family's heading, a line that neither
// names its tests nor says it has none, a test name without its package)
// are reported on t.
func readDefinitions(t *testing.T, root string) map[string]definition {
	t.Helper()
	f, err := os.Open(filepath.Join(root, requirementsFile))
	require.NoError(t, err)
	defer f.Close()
	defs := map[string]definition{}
	family := ""
	sc := bufio.NewScanner(f)
	sc.Buffer(nil, 1<<20)
	for n := 1; sc.Scan(); n++ {
		line := sc.Text()
		if m := familyPattern.FindStringSubmatch(line); m != nil {
			family = m[1]
			continue
		}
		if strings.HasPrefix(line, "## ") {
			family = ""
			continue
		}
		m := definitionPattern.FindStringSubmatch(line)
		if m == nil {
			if strings.HasPrefix(line, "- **") {
				t.Errorf("%s:%d: a list item that is no definition: write it as \"- **ID** text\"", requirementsFile, n)
			}
			continue
		}
		id := m[1]
		if prev, ok := defs[id]; ok {
			t.Errorf("%s:%d: %s is defined twice (also at line %d)", requirementsFile, n, id, prev.Line)
		}
		if id[:1] != family {
			t.Errorf("%s:%d: %s is not under the heading of its family (## %s: …)", requirementsFile, n, id, id[:1])
		}
		if !strings.Contains(m[2], "Tests") && !strings.Contains(m[2], "No test") {
			t.Errorf("%s:%d: %s names no tests: list them (\"Tests: `pkg`: `TestX`\") or say \"No test\" and why", requirementsFile, n, id)
		}
		defs[id] = definition{ID: id, Line: n, Text: m[2]}
	}
	require.NoError(t, sc.Err())
	require.NotEmpty(t, defs, "%s defines no requirement", requirementsFile)
	return defs
}

// testRefs returns the tests a definition names. A test name outside a
// "`pkg`: `TestX`" group is reported, since its package is unknown.
func testRefs(t *testing.T, d definition) []testRef {
	t.Helper()
	var refs []testRef
	covered := map[int]bool{}
	for _, g := range testRefPattern.FindAllStringSubmatchIndex(d.Text, -1) {
		pkg := d.Text[g[2]:g[3]]
		for _, name := range strings.Split(d.Text[g[4]:g[5]], ", ") {
			refs = append(refs, testRef{Pkg: pkg, Name: strings.Trim(name, "`")})
		}
		for i := g[4]; i < g[5]; i++ {
			covered[i] = true
		}
	}
	for _, m := range testNamePattern.FindAllStringSubmatchIndex(d.Text, -1) {
		if !covered[m[0]] {
			t.Errorf("%s:%d: %s names %s without its package: write \"`pkg/dir`: `%s`\"",
				requirementsFile, d.Line, d.ID, d.Text[m[2]:m[3]], d.Text[m[2]:m[3]])
		}
	}
	return refs
}

// testFuncs returns the names of the top-level functions declared in the
// _test.go files of dir, whatever their build tags.
func testFuncs(dir string) (map[string]bool, error) {
	files, err := filepath.Glob(filepath.Join(dir, "*_test.go"))
	if err != nil {
		return nil, err
	}
	if len(files) == 0 {
		return nil, fmt.Errorf("no _test.go files in %s", dir)
	}
	names := map[string]bool{}
	fset := token.NewFileSet()
	for _, f := range files {
		file, err := parser.ParseFile(fset, f, nil, parser.SkipObjectResolution)
		if err != nil {
			return nil, err
		}
		for _, decl := range file.Decls {
			if fd, ok := decl.(*ast.FuncDecl); ok && fd.Recv == nil {
				names[fd.Name.Name] = true
			}
		}
	}
	return names, nil
}

// TestRequirementTagsAreDefined: every requirement ID cited anywhere in the
// repository has its line in requirements.md. A failure names each
// citation: file, line and tag.
func TestRequirementTagsAreDefined(t *testing.T) {
	t.Parallel()
	root := moduleRoot(t)
	defs := readDefinitions(t, root)
	cites := citations(t, root)
	require.NotEmpty(t, cites, "no requirement tag found anywhere: the scan is broken")
	for _, c := range cites {
		if _, ok := defs[c.ID]; !ok {
			t.Errorf("%s has no definition in %s: add a line for it under its family, or, if it is not a requirement, reword it or add an exclusion to notATag",
				c, requirementsFile)
		}
	}
}

// TestRequirementTestsExist: every test requirements.md names exists, as a
// top-level function of a _test.go file in the package directory given.
func TestRequirementTestsExist(t *testing.T) {
	t.Parallel()
	root := moduleRoot(t)
	defs := readDefinitions(t, root)
	ids := make([]string, 0, len(defs))
	for id := range defs {
		ids = append(ids, id)
	}
	sort.Strings(ids)
	funcs := map[string]map[string]bool{}
	named := 0
	for _, id := range ids {
		d := defs[id]
		for _, ref := range testRefs(t, d) {
			named++
			if !testNameOnly.MatchString(ref.Name) {
				t.Errorf("%s:%d: %s names %s in %s, which is not a test, benchmark, fuzz target or example name",
					requirementsFile, d.Line, id, ref.Name, ref.Pkg)
				continue
			}
			fns, ok := funcs[ref.Pkg]
			if !ok {
				var err error
				fns, err = testFuncs(filepath.Join(root, filepath.FromSlash(ref.Pkg)))
				if err != nil {
					t.Errorf("%s:%d: %s names tests in %s: %v", requirementsFile, d.Line, id, ref.Pkg, err)
				}
				funcs[ref.Pkg] = fns
			}
			if fns != nil && !fns[ref.Name] {
				t.Errorf("%s:%d: %s names %s: %s, which no _test.go file of %s declares",
					requirementsFile, d.Line, id, ref.Pkg, ref.Name, ref.Pkg)
			}
		}
	}
	require.NotZero(t, named, "%s names no test at all: the parser is broken", requirementsFile)
}

// TestTagExtraction pins what counts as a requirement tag, including each
// exclusion of notATag.
func TestTagExtraction(t *testing.T) {
	t.Parallel()
	cases := []struct {
		line string
		want []string
	}{
		{"// TestFencing: a relay … (R2).", []string{"R2"}},
		{"refinements (R5a, C4a) and a list (W4, W5, L2)", []string{"R5a", "C4a", "W4", "W5", "L2"}},
		{"## Relay (R1–R9)", []string{"R1", "R9", "R2", "R3", "R4", "R5", "R6", "R7", "R8"}},
		{"the operations (O4-O6)", []string{"O4", "O6", "O5"}},
		{"-- holds for every relay, R4), and", []string{"R4"}},
		{"W3C trace context, 0xC3, C3A9, R5ab, V5_x, xR2", nil},
		{"?aggregate=%C3%A9t%C3%A9&since=2h", nil},
		{"uuid.V5 and dns.S3 are selectors", nil},
		{"control characters (C0, DEL, C1, U+2028/2029", nil},
		{"the C0 and C1 controls", nil},
		{"after the local commit (C1).", []string{"C1"}},
		{"R5.", []string{"R5"}},
	}
	for _, c := range cases {
		got, _ := tagsIn(c.line)
		require.Equal(t, c.want, got, "%q", c.line)
	}
}
