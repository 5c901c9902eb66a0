package inbox_test

import (
	"go/ast"
	"go/doc"
	"go/parser"
	"go/token"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
	"unicode"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/stretchr/testify/require"

	"github.com/outboxref/orders/internal/inbox"
)

// TestSelfContained: the inbox is copied into other services with its
// directory and one import-path change, so it may import nothing of this
// module but itself and the record format it reads (the outbox's
// cloudevents package, which a consumer copies along).
func TestSelfContained(t *testing.T) {
	t.Parallel()
	// The module of this package, not `go list -m`, which lists every
	// module of a go.work workspace and would match nothing.
	mod, err := exec.Command("go", "list", "-f", "{{.Module.Path}}", ".").Output()
	require.NoError(t, err)
	module := strings.TrimSpace(string(mod))
	require.NotEmpty(t, module)
	require.NotContains(t, module, "\n")
	deps, err := exec.Command("go", "list", "-deps", "-test", "-f", "{{.ImportPath}}", ".").Output()
	require.NoError(t, err)
	allowed := []string{module + "/internal/inbox", module + "/internal/outbox/cloudevents"}
	for _, dep := range strings.Fields(string(deps)) {
		dep = strings.Fields(strings.NewReplacer("[", " ", "]", " ").Replace(dep))[0]
		if dep != module && !strings.HasPrefix(dep, module+"/") {
			continue
		}
		ok := false
		for _, a := range allowed {
			// The package itself, its sub-packages, and its test packages
			// (inbox_test, inbox.test).
			ok = ok || dep == a || strings.HasPrefix(dep, a+"/") || strings.HasPrefix(dep, a+".") || strings.HasPrefix(dep, a+"_")
		}
		require.True(t, ok, "the inbox depends on %s, which a service copying it would not have", dep)
	}
}

// TestPublicAPINamesNoGeneratedCode: a service calls the inbox through its
// own types, so that regenerating the queries (or replacing sqlc) never
// changes what callers compile against. The documented API must not name
// the generated package, not even through an alias.
func TestPublicAPINamesNoGeneratedCode(t *testing.T) {
	t.Parallel()
	doc, err := exec.Command("go", "doc", "-all", ".").Output()
	require.NoError(t, err)
	require.NotContains(t, string(doc), "inboxdb.", "the inbox's exported API exposes its generated code")
}

// What DBTX promises: a pool, a connection and a transaction all satisfy it.
var (
	_ inbox.DBTX = (*pgxpool.Pool)(nil)
	_ inbox.DBTX = (*pgx.Conn)(nil)
	_ inbox.DBTX = pgx.Tx(nil)
)

// TestPackageDocListsAPI: the package doc is where a reader learns the
// inbox's API, grouped by who calls it, so every exported name (a method as
// Type.Method) must appear in it; a name added without a place in the list
// fails here.
func TestPackageDocListsAPI(t *testing.T) {
	t.Parallel()
	fset := token.NewFileSet()
	var files []*ast.File
	paths, err := filepath.Glob("*.go")
	require.NoError(t, err)
	for _, p := range paths {
		if strings.HasSuffix(p, "_test.go") {
			continue
		}
		f, err := parser.ParseFile(fset, p, nil, parser.ParseComments)
		require.NoError(t, err)
		files = append(files, f)
	}
	pkg, err := doc.NewFromFiles(fset, files, "github.com/outboxref/orders/internal/inbox")
	require.NoError(t, err)
	words := map[string]bool{}
	for _, w := range strings.FieldsFunc(pkg.Doc, func(r rune) bool {
		return !unicode.IsLetter(r) && !unicode.IsDigit(r) && r != '.' && r != '_'
	}) {
		words[strings.TrimRight(w, ".")] = true
	}
	var names []string
	values := func(vs []*doc.Value) {
		for _, v := range vs {
			names = append(names, v.Names...)
		}
	}
	values(pkg.Consts)
	values(pkg.Vars)
	for _, f := range pkg.Funcs {
		names = append(names, f.Name)
	}
	for _, typ := range pkg.Types {
		names = append(names, typ.Name)
		values(typ.Consts)
		values(typ.Vars)
		for _, f := range typ.Funcs {
			names = append(names, f.Name)
		}
		for _, m := range typ.Methods {
			if m.Name != "Error" && m.Name != "Unwrap" { // the error interface's
				names = append(names, typ.Name+"."+m.Name)
			}
		}
	}
	for _, n := range names {
		require.True(t, words[n], "the package doc does not list %s", n)
	}
}
