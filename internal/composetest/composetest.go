// Package composetest checks compose.yaml against the code it runs, for
// tests only. A compose file is configuration that no compiler reads and,
// on a machine without a Docker engine, nothing runs: a renamed variable,
// a health check calling a missing subcommand or a port clash with the
// local demo would go unnoticed until someone types `docker compose up`.
//
// The package loads the file with the compose-spec loader (the parser
// Docker Compose uses), finds every place it runs one of the module's
// binaries, and records which environment variables a binary's own config
// code reads. The file-wide checks are in this package's tests; each
// binary checks its services' environment from its own package
// (cmd/orders/compose_test.go), where its unexported config loaders are.
package composetest

import (
	"bufio"
	"context"
	"go/build"
	"os"
	"path"
	"path/filepath"
	"slices"
	"sort"
	"strconv"
	"strings"
	"testing"

	"github.com/compose-spec/compose-go/v2/cli"
	"github.com/compose-spec/compose-go/v2/types"
	"github.com/stretchr/testify/require"
)

// Root returns the repository root: the nearest directory at or above the
// test's working directory that holds go.mod.
func Root(t testing.TB) string {
	t.Helper()
	dir, err := os.Getwd()
	require.NoError(t, err)
	for {
		if _, err := os.Stat(filepath.Join(dir, "go.mod")); err == nil {
			return dir
		}
		parent := filepath.Dir(dir)
		require.NotEqual(t, dir, parent, "no go.mod above the working directory")
		dir = parent
	}
}

// Load reads compose.yaml at the repository root as `docker compose config`
// would: anchors, defaults and the spec's validation. Interpolation sees an
// empty environment, so the result does not depend on the shell that runs
// the test.
func Load(t testing.TB) *types.Project {
	t.Helper()
	root := Root(t)
	opts, err := cli.NewProjectOptions(
		[]string{filepath.Join(root, "compose.yaml")},
		cli.WithWorkingDirectory(root),
	)
	require.NoError(t, err)
	p, err := opts.LoadProject(context.Background())
	require.NoError(t, err, "compose.yaml does not load")
	return p
}

// ProjectImage returns the image built from this repository and the names
// of the services that run it, sorted. Exactly one service may build it
// (the others name the same image), so that `docker compose build` builds
// it once.
func ProjectImage(t testing.TB, p *types.Project) (image string, services []string) {
	t.Helper()
	var builders []string
	for name, s := range p.Services {
		if s.Build != nil {
			builders = append(builders, name)
			image = s.Image
		}
	}
	require.Len(t, builders, 1, "exactly one service builds the image; the others name it with image:")
	require.NotEmpty(t, image, "service %s builds an image without naming it (image:), so other services cannot share it", builders[0])
	for name, s := range p.Services {
		if s.Image == image {
			services = append(services, name)
		}
	}
	sort.Strings(services)
	return image, services
}

// Invocation is one run of a module binary in compose: a service's main
// process or its health check, with the environment it sees.
type Invocation struct {
	Service string
	Role    string   // "command" or "healthcheck"
	Binary  string   // the binary's name under cmd/: "orders"
	Args    []string // ["serve"]
	Env     map[string]string
}

// Invocations returns every run of a module binary in compose, sorted by
// service. A service running the project image must name its binary in
// entrypoint, and its health check must be a CMD (the image has no shell
// for CMD-SHELL).
func Invocations(t testing.TB, p *types.Project) []Invocation {
	t.Helper()
	_, services := ProjectImage(t, p)
	var out []Invocation
	for _, name := range services {
		s := p.Services[name]
		env := map[string]string{}
		for k, v := range s.Environment {
			env[k] = ""
			if v != nil {
				env[k] = *v
			}
		}
		argv := append(slices.Clone([]string(s.Entrypoint)), s.Command...)
		require.NotEmpty(t, s.Entrypoint, "service %s runs the project image: name its binary in entrypoint", name)
		out = append(out, Invocation{Service: name, Role: "command", Binary: path.Base(argv[0]), Args: argv[1:], Env: env})
		if hc := s.HealthCheck; hc != nil && !hc.Disable && len(hc.Test) > 0 && hc.Test[0] != "NONE" {
			require.Equal(t, "CMD", hc.Test[0], "service %s: the image has no shell, so its health check must be a CMD", name)
			require.Greater(t, len(hc.Test), 1, "service %s: empty health check", name)
			out = append(out, Invocation{Service: name, Role: "healthcheck", Binary: path.Base(hc.Test[1]), Args: hc.Test[2:], Env: env})
		}
	}
	return out
}

// IsCommand reports whether cmd/NAME is a main package of the module.
func IsCommand(t testing.TB, name string) bool {
	t.Helper()
	pkg, err := build.ImportDir(filepath.Join(Root(t), "cmd", name), 0)
	return err == nil && pkg.IsCommand()
}

// Recorder is a getenv that answers from a service's environment and
// records every variable asked for.
type Recorder struct {
	env  map[string]string
	read map[string]bool
}

// NewRecorder returns a Recorder answering from env.
func NewRecorder(env map[string]string) *Recorder {
	return &Recorder{env: env, read: map[string]bool{}}
}

// Getenv returns the variable's value and records that it was read.
func (r *Recorder) Getenv(key string) string {
	r.read[key] = true
	return r.env[key]
}

// Read returns the variables read so far, sorted.
func (r *Recorder) Read() []string {
	keys := make([]string, 0, len(r.read))
	for k := range r.read {
		keys = append(keys, k)
	}
	sort.Strings(keys)
	return keys
}

// Loader reads one subcommand's settings through getenv, exactly as the
// binary does when it starts, and returns their validation error.
type Loader func(getenv func(string) string) error

// CheckEnvironment checks every service that runs binary: each variable
// compose sets for it is read by the config code of a subcommand the
// service runs (its command or its health check), and the values compose
// gives pass that code's validation. loaders maps each subcommand to its
// config code; a subcommand compose runs without a loader fails the check.
func CheckEnvironment(t *testing.T, binary string, loaders map[string]Loader) {
	t.Helper()
	p := Load(t)
	read := map[string]map[string]bool{} // service -> variables read
	env := map[string]map[string]string{}
	for _, inv := range Invocations(t, p) {
		if inv.Binary != binary {
			continue
		}
		require.NotEmpty(t, inv.Args, "service %s runs %s without a subcommand", inv.Service, binary)
		sub := inv.Args[0]
		load, ok := loaders[sub]
		require.True(t, ok, "service %s (%s) runs `%s %s`, which has no config loader in this check", inv.Service, inv.Role, binary, sub)

		rec := NewRecorder(inv.Env)
		require.NoError(t, load(rec.Getenv), "service %s (%s): `%s %s` refuses compose's environment", inv.Service, inv.Role, binary, sub)
		// A variable read on one branch only would be missed with some
		// values: the loaders read every variable whatever the others say,
		// which an empty environment confirms.
		empty := NewRecorder(map[string]string{})
		_ = load(empty.Getenv)
		require.Equal(t, empty.Read(), rec.Read(), "`%s %s` reads different variables depending on their values; read each one unconditionally", binary, sub)

		if read[inv.Service] == nil {
			read[inv.Service] = map[string]bool{}
		}
		for _, k := range rec.Read() {
			read[inv.Service][k] = true
		}
		env[inv.Service] = inv.Env
	}
	require.NotEmpty(t, read, "compose.yaml runs no %s", binary)
	for service, vars := range env {
		var unread []string
		for k := range vars {
			if !read[service][k] {
				unread = append(unread, k)
			}
		}
		sort.Strings(unread)
		require.Empty(t, unread, "service %s sets variables that %s never reads (a typo, or a setting that was renamed or removed)", service, binary)
	}
}

// DemoEnv returns the defaults of the local demo from scripts/demo.env,
// parsed as scripts/demo.sh reads them: KEY=value lines, split at the
// first "=", with blank lines and # comments skipped.
func DemoEnv(t testing.TB) map[string]string {
	t.Helper()
	f, err := os.Open(filepath.Join(Root(t), "scripts", "demo.env"))
	require.NoError(t, err)
	defer f.Close()
	env := map[string]string{}
	sc := bufio.NewScanner(f)
	for sc.Scan() {
		line := sc.Text()
		if line == "" || strings.HasPrefix(line, "#") {
			continue
		}
		k, v, ok := strings.Cut(line, "=")
		require.True(t, ok, "scripts/demo.env: %q is not KEY=value", line)
		env[k] = v
	}
	require.NoError(t, sc.Err())
	return env
}

// DemoPorts returns the host ports the local demo uses, each with the
// variable that sets it: every *_PORT of scripts/demo.env.
func DemoPorts(t testing.TB) map[int]string {
	t.Helper()
	ports := map[int]string{}
	for k, v := range DemoEnv(t) {
		if !strings.HasSuffix(k, "_PORT") {
			continue
		}
		n, err := strconv.Atoi(v)
		require.NoError(t, err, "scripts/demo.env: %s=%q is not a port", k, v)
		ports[n] = k
	}
	require.NotEmpty(t, ports, "scripts/demo.env names no *_PORT")
	return ports
}

// PublishedPorts returns the host ports a service publishes, a range
// ("18081-18084") expanded.
func PublishedPorts(t testing.TB, s types.ServiceConfig) []int {
	t.Helper()
	var out []int
	for _, p := range s.Ports {
		if p.Published == "" {
			continue // an ephemeral port, chosen by the engine
		}
		lo, hi, isRange := strings.Cut(p.Published, "-")
		if !isRange {
			hi = lo
		}
		from, err := strconv.Atoi(lo)
		require.NoError(t, err, "service %s: published port %q", s.Name, p.Published)
		to, err := strconv.Atoi(hi)
		require.NoError(t, err, "service %s: published port %q", s.Name, p.Published)
		for n := from; n <= to; n++ {
			out = append(out, n)
		}
	}
	return out
}
