package outbox_test

import (
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"slices"
	"strings"
	"testing"

	"github.com/stretchr/testify/require"
)

// TestSelfContained (L1): the outbox, its subpackages and their tests
// import nothing from this module outside internal/outbox, so a service can
// copy the directory with `cp -r`, change one import path, and build and
// test it. Everything from outside the module (pgx, franz-go, ...) is fine:
// go.mod brings it along.
func TestSelfContained(t *testing.T) {
	t.Parallel()
	require.Empty(t, foreignImports(t, "."),
		"internal/outbox must not import the service around it; move the code in, or pass it in from the caller")
}

// TestForeignImportsFindsViolations shows that the check above can fail:
// in a throw-away module, a unit importing a sibling package, from its code
// or only from its tests, is reported, and a self-contained unit is not.
func TestForeignImportsFindsViolations(t *testing.T) {
	t.Parallel()
	dir := t.TempDir()
	write := func(name, content string) {
		t.Helper()
		p := filepath.Join(dir, name)
		require.NoError(t, os.MkdirAll(filepath.Dir(p), 0o755))
		require.NoError(t, os.WriteFile(p, []byte(content), 0o600))
	}
	write("go.mod", "module example.com/svc\n\ngo 1.22\n")
	write("service/service.go", "package service\n\nconst Name = \"svc\"\n")
	write("testkit/testkit.go", "package testkit\n\nconst DB = \"db\"\n")
	write("unit/unit.go", "package unit\n\nimport \"example.com/svc/service\"\n\nvar _ = service.Name\n")
	write("unit/sub/sub.go", "package sub\n\nimport _ \"example.com/svc/unit\"\n")
	write("unit/sub/sub_test.go", "package sub_test\n\nimport (\n\t\"testing\"\n\n\t\"example.com/svc/testkit\"\n)\n\nfunc TestX(t *testing.T) { _ = testkit.DB }\n")
	write("clean/clean.go", "package clean\n\nimport _ \"example.com/svc/clean/inner\"\n")
	write("clean/inner/inner.go", "package inner\n")

	require.Equal(t, []string{
		"example.com/svc/unit imports example.com/svc/service",
		"example.com/svc/unit/sub_test imports example.com/svc/testkit",
	}, foreignImports(t, filepath.Join(dir, "unit")))
	require.Empty(t, foreignImports(t, filepath.Join(dir, "clean")))
}

// foreignImports lists the imports, of the package in dir, the packages
// under it and all their tests, that reach into the same module outside
// dir: "importer imports imported", sorted. It asks the go command, so it
// sees exactly what a build sees (build tags, test-only imports).
//
// It is written to be copied: another reusable unit gets the same check by
// pasting this function into its tests and calling it with ".".
func foreignImports(t *testing.T, dir string) []string {
	t.Helper()
	goCmd, err := exec.LookPath("go")
	require.NoError(t, err, "the go command is needed to list imports")
	list := func(args ...string) []string {
		t.Helper()
		cmd := exec.Command(goCmd, append([]string{"list"}, args...)...)
		cmd.Dir = dir
		var stderr strings.Builder
		cmd.Stderr = &stderr
		out, err := cmd.Output()
		require.NoError(t, err, "go list %s in %s:\n%s", strings.Join(args, " "), dir, stderr.String())
		return strings.Split(strings.TrimSpace(string(out)), "\n")
	}
	unit, module, _ := strings.Cut(list("-f", "{{.ImportPath}}\t{{.Module.Path}}", ".")[0], "\t")

	inside := func(path, root string) bool { return path == root || strings.HasPrefix(path, root+"/") }
	// With -test, a package compiled for tests is listed as "p [p.test]",
	// its external tests as "p_test [p.test]" and the generated test main
	// as "p.test".
	variant := regexp.MustCompile(` \[.*\]$`)
	var found []string
	// -deps adds every package the unit's packages need; -test adds their
	// test variants, whose imports include the test-only ones. One line
	// per import edge.
	edges := list("-deps", "-test", "-f", "{{$p := .ImportPath}}{{range .Imports}}{{$p}}\t{{.}}\n{{end}}", "./...")
	for _, edge := range edges {
		from, to, ok := strings.Cut(edge, "\t")
		if !ok {
			continue
		}
		from, to = variant.ReplaceAllString(from, ""), variant.ReplaceAllString(to, "")
		if strings.HasSuffix(from, ".test") || !inside(strings.TrimSuffix(from, "_test"), unit) {
			continue // the generated test main, or a dependency outside the unit
		}
		if inside(to, module) && !inside(to, unit) {
			found = append(found, from+" imports "+to)
		}
	}
	slices.Sort(found)
	return slices.Compact(found)
}
