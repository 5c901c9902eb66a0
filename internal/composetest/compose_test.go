package composetest_test

import (
	"os"
	"path/filepath"
	"regexp"
	"sort"
	"strings"
	"testing"

	"github.com/compose-spec/compose-go/v2/types"
	"github.com/stretchr/testify/require"

	"github.com/outboxref/orders/internal/composetest"
)

// TestCompose checks compose.yaml against the rest of the repository, so
// that it keeps working on a fresh Docker host although nothing here can
// run it. Each binary's environment is checked in its own package
// (TestComposeEnvironment in cmd/orders and cmd/notifier).
func TestCompose(t *testing.T) {
	t.Parallel()
	p := composetest.Load(t)
	root := composetest.Root(t)
	dockerfile, err := os.ReadFile(filepath.Join(root, "Dockerfile"))
	require.NoError(t, err)

	// A one-shot job is a service that others wait for to complete
	// (the migrations); every other service runs until stopped.
	oneShot := map[string]bool{}
	for _, s := range p.Services {
		for dep, d := range s.DependsOn {
			if d.Condition == types.ServiceConditionCompletedSuccessfully {
				oneShot[dep] = true
			}
		}
	}

	t.Run("LongRunningServicesHaveHealthchecksAndRestart", func(t *testing.T) {
		t.Parallel()
		for name, s := range p.Services {
			if oneShot[name] {
				require.Contains(t, []string{"", types.RestartPolicyNo}, s.Restart,
					"one-shot service %s must not be restarted after it completes", name)
				continue
			}
			hc := s.HealthCheck
			require.True(t, hc != nil && !hc.Disable && len(hc.Test) > 0 && hc.Test[0] != "NONE",
				"long-running service %s has no health check, so nothing can wait for it to be ready", name)
			require.Contains(t, []string{types.RestartPolicyAlways, types.RestartPolicyUnlessStopped, types.RestartPolicyOnFailure}, s.Restart,
				"long-running service %s has no restart policy", name)
		}
	})

	t.Run("MountedFilesExist", func(t *testing.T) {
		t.Parallel()
		for name, s := range p.Services {
			for _, v := range s.Volumes {
				if v.Type != types.VolumeTypeBind {
					continue
				}
				_, err := os.Stat(v.Source)
				require.NoError(t, err, "service %s mounts %s, which the repository lacks", name, v.Source)
			}
		}
	})

	t.Run("DependenciesWaitForHealthOrCompletion", func(t *testing.T) {
		t.Parallel()
		for name, s := range p.Services {
			for dep, d := range s.DependsOn {
				want := types.ServiceConditionHealthy
				if oneShot[dep] {
					want = types.ServiceConditionCompletedSuccessfully
				}
				require.Equal(t, want, d.Condition, "service %s depends on %s", name, dep)
			}
		}
	})

	t.Run("PublishedPortsAvoidTheLocalDemo", func(t *testing.T) {
		t.Parallel()
		demo := composetest.DemoPorts(t)
		owner := map[int]string{}
		for name, s := range p.Services {
			for _, port := range composetest.PublishedPorts(t, s) {
				v, clash := demo[port]
				require.False(t, clash, "service %s publishes %d, which `make demo` uses (%s in scripts/demo.env): the two demos could not run side by side", name, port, v)
				other, dup := owner[port]
				require.False(t, dup, "services %s and %s both publish %d", name, other, port)
				owner[port] = name
			}
		}
		require.NotEmpty(t, owner, "compose.yaml publishes no port at all")
	})

	t.Run("ImageBuiltOnce", func(t *testing.T) {
		t.Parallel()
		image, services := composetest.ProjectImage(t, p)
		require.Greater(t, len(services), 1, "only one service runs %s", image)
		for _, name := range services {
			if p.Services[name].Build == nil {
				require.Equal(t, types.PullPolicyNever, p.Services[name].PullPolicy,
					"service %s runs the locally built %s: it must not try to pull it", name, image)
			}
		}
	})

	t.Run("BuildTargetsExist", func(t *testing.T) {
		t.Parallel()
		stages := map[string]bool{}
		for _, m := range regexp.MustCompile(`(?mi)^FROM\s+\S+\s+AS\s+(\S+)`).FindAllStringSubmatch(string(dockerfile), -1) {
			stages[strings.ToLower(m[1])] = true
		}
		for name, s := range p.Services {
			if s.Build == nil {
				continue
			}
			file := s.Build.Dockerfile
			if file == "" {
				file = "Dockerfile"
			}
			if !filepath.IsAbs(file) {
				file = filepath.Join(s.Build.Context, file)
			}
			require.Equal(t, filepath.Join(root, "Dockerfile"), file, "service %s builds from another Dockerfile than the one checked here", name)
			if s.Build.Target != "" {
				require.True(t, stages[strings.ToLower(s.Build.Target)], "service %s builds target %q, which the Dockerfile does not define", name, s.Build.Target)
			}
		}
	})

	t.Run("BinariesExist", func(t *testing.T) {
		t.Parallel()
		invs := composetest.Invocations(t, p)
		require.NotEmpty(t, invs)
		command := map[string]string{}
		for _, inv := range invs {
			require.True(t, composetest.IsCommand(t, inv.Binary), "service %s (%s) runs %q, which is not a command under cmd/", inv.Service, inv.Role, inv.Binary)
			if inv.Role == "command" {
				command[inv.Service] = inv.Binary
			}
		}
		for _, inv := range invs {
			if inv.Role == "healthcheck" {
				require.Equal(t, command[inv.Service], inv.Binary, "service %s: its health check must run the service's own binary, which knows its address", inv.Service)
			}
		}
		// The image's default command too.
		for _, m := range regexp.MustCompile(`(?m)^ENTRYPOINT\s+\["([^"]+)"`).FindAllStringSubmatch(string(dockerfile), -1) {
			require.True(t, composetest.IsCommand(t, filepath.Base(m[1])), "the Dockerfile's ENTRYPOINT %q is not a command under cmd/", m[1])
		}
	})

	t.Run("GoVersionMatchesGoMod", func(t *testing.T) {
		t.Parallel()
		gomod, err := os.ReadFile(filepath.Join(root, "go.mod"))
		require.NoError(t, err)
		m := regexp.MustCompile(`(?m)^go (\d+\.\d+)`).FindSubmatch(gomod)
		require.NotNil(t, m, "go.mod has no go directive")
		images := regexp.MustCompile(`(?mi)^FROM\s+golang:(\d+\.\d+)`).FindAllSubmatch(dockerfile, -1)
		require.NotEmpty(t, images, "the Dockerfile builds with no golang image")
		for _, img := range images {
			require.Equal(t, string(m[1]), string(img[1]), "the Dockerfile builds with Go %s, go.mod says %s", img[1], m[1])
		}
	})

	t.Run("MailpitMatchesTheLocalDemo", func(t *testing.T) {
		t.Parallel()
		want := composetest.DemoEnv(t)["MAILPIT_VERSION"]
		require.NotEmpty(t, want, "scripts/demo.env has no MAILPIT_VERSION")
		var found []string
		for name, s := range p.Services {
			if repo, tag, _ := strings.Cut(s.Image, ":"); repo == "axllent/mailpit" {
				found = append(found, name)
				require.Equal(t, want, tag, "service %s runs Mailpit %q, `make demo` %s", name, tag, want)
			}
		}
		sort.Strings(found)
		require.Len(t, found, 1, "compose.yaml should run one Mailpit")
	})
}
