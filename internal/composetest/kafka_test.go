package composetest_test

import (
	"context"
	"errors"
	"io"
	"log/slog"
	"net"
	"regexp"
	"slices"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/compose-spec/compose-go/v2/types"
	"github.com/stretchr/testify/require"
	"github.com/twmb/franz-go/pkg/kadm"
	"github.com/twmb/franz-go/pkg/kerr"
	"github.com/twmb/franz-go/pkg/kfake"
	"github.com/twmb/franz-go/pkg/kgo"
	"github.com/twmb/franz-go/pkg/kmsg"

	"github.com/outboxref/orders/internal/composetest"
	"github.com/outboxref/orders/internal/kafkaconf"
	"github.com/outboxref/orders/internal/outbox/relay"
)

// TestComposeKafkaSecurity checks the broker's half of C7 in compose.yaml:
// only the orders service's principal can write to the topic. Every
// listener authenticates, the authorizer denies what no ACL allows, the
// services log in with credentials the broker knows, the kafka-acls job
// runs before them, and the ACLs it creates let each service do what it
// does and no other principal write.
//
// Nothing here runs Kafka. The job's ACLs are applied to kfake, whose
// authorizer follows Kafka's rules (Read and Write imply Describe; Create
// on the cluster or the topic; IdempotentWrite on the cluster or Write on
// some topic), and the clients make the calls the services make: the
// relay's relay.EnsureTopic and an idempotent produce, the notifier's
// group fetch, offset commit and lag reading.
func TestComposeKafkaSecurity(t *testing.T) {
	t.Parallel()
	p := composetest.Load(t)
	broker := kafkaBroker(t, p)
	benv := envOf(broker)
	job := aclJob(t, p)
	listeners := kafkaListeners(t, benv)
	superUsers := map[string]bool{}
	for _, u := range strings.Split(benv["KAFKA_SUPER_USERS"], ";") {
		if u = strings.TrimSpace(u); u != "" {
			superUsers[u] = true
		}
	}
	clients := kafkaClients(t, p)
	require.NotEmpty(t, clients["orders"], "no orders service talks to Kafka")
	require.NotEmpty(t, clients["notifier"], "no notifier service talks to Kafka")
	admin := adminClientConfig(t, p, job)

	t.Run("ListenersAuthenticate", func(t *testing.T) {
		t.Parallel()
		for name, l := range listeners {
			require.True(t, strings.HasPrefix(l.protocol, "SASL_"),
				"listener %s is %s: a client that does not log in is User:ANONYMOUS, which no ACL should have to exclude", name, l.protocol)
			require.NotEmpty(t, l.users, "listener %s has no PLAIN users (KAFKA_LISTENER_NAME_%s_PLAIN_SASL_JAAS_CONFIG)", name, name)
		}
		require.Equal(t, "PLAIN", benv["KAFKA_SASL_ENABLED_MECHANISMS"])
		require.NotContains(t, superUsers, "User:ANONYMOUS")
		// The broker logs in to its own listeners: between brokers and to
		// the controller, with the JAAS username/password of each. The
		// image's default inter-broker listener is PLAINTEXT, and both
		// mechanisms default to GSSAPI.
		for _, role := range []struct{ listenerVar, mechanismVar string }{
			{"KAFKA_INTER_BROKER_LISTENER_NAME", "KAFKA_SASL_MECHANISM_INTER_BROKER_PROTOCOL"},
			{"KAFKA_CONTROLLER_LISTENER_NAMES", "KAFKA_SASL_MECHANISM_CONTROLLER_PROTOCOL"},
		} {
			l, ok := listeners[benv[role.listenerVar]]
			require.True(t, ok, "%s=%q names no listener of KAFKA_LISTENERS", role.listenerVar, benv[role.listenerVar])
			require.Equal(t, "PLAIN", benv[role.mechanismVar])
			require.NotEmpty(t, l.self.user, "listener %s: its JAAS config has no username for the broker itself", l.name)
			require.Equal(t, l.self.pass, l.users[l.self.user], "listener %s: the broker's own login is not one of the listener's users", l.name)
			require.True(t, superUsers["User:"+l.self.user], "the broker logs in as %s, which is not a super user: it could not register with the controller", l.self.user)
		}
	})

	t.Run("AuthorizerDeniesByDefault", func(t *testing.T) {
		t.Parallel()
		require.Equal(t, "org.apache.kafka.metadata.authorizer.StandardAuthorizer", benv["KAFKA_AUTHORIZER_CLASS_NAME"])
		require.Equal(t, "false", benv["KAFKA_ALLOW_EVERYONE_IF_NO_ACL_FOUND"])
	})

	t.Run("ServicesLogIn", func(t *testing.T) {
		t.Parallel()
		for _, cs := range clients {
			for _, c := range cs {
				l := listenerFor(t, listeners, c.broker)
				require.Equal(t, "PLAIN", c.conn.SASLMechanism, "service %s must log in to Kafka (KAFKA_SASL_MECHANISM)", c.service)
				require.NotEmpty(t, c.conn.SASLUsername, "service %s: KAFKA_SASL_USERNAME", c.service)
				require.Equal(t, l.users[c.conn.SASLUsername], c.conn.SASLPassword,
					"service %s logs in as %q, which listener %s does not know with that password", c.service, c.conn.SASLUsername, l.name)
				require.False(t, superUsers["User:"+c.conn.SASLUsername], "service %s runs as a super user: ACLs would not bind it", c.service)
			}
		}
		l := listenerFor(t, listeners, admin.broker)
		require.Equal(t, l.users[admin.user], admin.pass, "the admin client config logs in as %q, which listener %s does not know with that password", admin.user, l.name)
		require.True(t, superUsers["User:"+admin.user], "the admin client config logs in as %s, who may not create ACLs", admin.user)
	})

	t.Run("ACLJobRunsFirst", func(t *testing.T) {
		t.Parallel()
		require.Equal(t, types.ServiceConditionHealthy, job.DependsOn[broker.Name].Condition,
			"service %s must wait for %s to be healthy", job.Name, broker.Name)
		for _, cs := range clients {
			for _, c := range cs {
				require.Equal(t, types.ServiceConditionCompletedSuccessfully, p.Services[c.service].DependsOn[job.Name].Condition,
					"service %s must start after %s created the ACLs, or its first requests are refused", c.service, job.Name)
			}
		}
		// The broker's health check logs in too, with the same file.
		hc := strings.Join(broker.HealthCheck.Test, " ")
		require.Contains(t, hc, "--command-config "+configTarget(t, broker, admin.config),
			"the health check of %s must log in (--command-config with the admin client config)", broker.Name)
	})

	writer := "User:" + clients["orders"][0].conn.SASLUsername
	acls := parseACLs(t, job)

	t.Run("OnlyOrdersWrites", func(t *testing.T) {
		t.Parallel()
		for _, a := range acls {
			require.NotEqual(t, "User:*", a.principal, "ACL %s grants every principal", a.line)
			require.NotEqual(t, "*", a.name, "ACL %s names every resource", a.line)
			if a.resource != kmsg.ACLResourceTypeTopic {
				continue
			}
			for _, op := range a.ops {
				switch op {
				case kmsg.ACLOperationRead, kmsg.ACLOperationDescribe:
				default:
					require.Equal(t, writer, a.principal, "ACL %s: only %s may change the topic", a.line, writer)
				}
			}
		}
	})

	t.Run("ACLsSuffice", func(t *testing.T) {
		t.Parallel()
		ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
		defer cancel()

		// A cluster that knows the users of the listener the services use.
		l := listenerFor(t, listeners, clients["orders"][0].broker)
		opts := []kfake.Opt{kfake.NumBrokers(1), kfake.EnableSASL(), kfake.EnableACLs()}
		for user, pass := range l.users {
			if superUsers["User:"+user] {
				opts = append(opts, kfake.Superuser(kafkaconf.Plain, user, pass))
			} else {
				opts = append(opts, kfake.User(kafkaconf.Plain, user, pass))
			}
		}
		cluster, err := kfake.NewCluster(opts...)
		require.NoError(t, err)
		t.Cleanup(cluster.Close)
		connect := func(c kafkaconf.Config) []kgo.Opt {
			c.Brokers = cluster.ListenAddrs()
			o, err := c.Options()
			require.NoError(t, err)
			return o
		}

		// The job's ACLs, created with the admin client config.
		adm := kadm.NewClient(newClient(t, connect(kafkaconf.Config{SASLMechanism: admin.mechanism, SASLUsername: admin.user, SASLPassword: admin.pass})))
		for _, a := range acls {
			b := kadm.NewACLs().Allow(a.principal).Operations(a.ops...).ResourcePatternType(kadm.ACLPatternLiteral)
			switch a.resource {
			case kmsg.ACLResourceTypeTopic:
				b.Topics(a.name)
			case kmsg.ACLResourceTypeGroup:
				b.Groups(a.name)
			default:
				b.Clusters()
			}
			res, err := adm.CreateACLs(ctx, b)
			require.NoError(t, err, "create ACL %s", a.line)
			for _, r := range res {
				require.NoError(t, r.Err, "create ACL %s", a.line)
			}
		}

		var topic string
		for _, c := range clients["orders"] {
			topic = c.env["ORDERS_TOPIC"]
			partitions, err := strconv.Atoi(c.env["ORDERS_TOPIC_PARTITIONS"])
			require.NoError(t, err, "service %s: ORDERS_TOPIC_PARTITIONS", c.service)
			o := connect(c.conn)
			log := slog.New(slog.NewTextHandler(io.Discard, nil))
			// Twice: the first start creates the topic, every later one
			// finds it (CreateTopics refused as existing, then Metadata).
			for range 2 {
				require.NoError(t, relay.EnsureTopic(ctx, o, topic, partitions, log),
					"service %s (%s) cannot create the topic it publishes to", c.service, c.conn.SASLUsername)
			}
			require.NoError(t, produce(ctx, t, o, topic), "service %s (%s) cannot produce", c.service, c.conn.SASLUsername)
		}

		for _, c := range clients["notifier"] {
			o := connect(c.conn)
			group := c.env["KAFKA_GROUP"]
			require.NotEmpty(t, group, "service %s: KAFKA_GROUP", c.service)
			require.Equal(t, topic, c.env["ORDERS_TOPIC"], "service %s reads another topic than orders writes", c.service)
			require.NoError(t, consume(ctx, t, o, group, topic),
				"service %s (%s) cannot consume in group %s and commit", c.service, c.conn.SASLUsername, group)
			lags, err := kadm.NewClient(newClient(t, o)).Lag(ctx, group)
			require.NoError(t, err)
			gl, ok := lags[group]
			require.True(t, ok, "group %s not described", group)
			require.NoError(t, gl.Error(), "service %s (%s) cannot read its lag", c.service, c.conn.SASLUsername)
			require.Contains(t, gl.Lag, topic)
		}

		// Every other principal the listener knows is refused a write:
		// through an idempotent producer (InitProducerId) and without one
		// (the Produce request itself).
		for user, pass := range l.users {
			if "User:"+user == writer || superUsers["User:"+user] {
				continue
			}
			o := connect(kafkaconf.Config{SASLMechanism: kafkaconf.Plain, SASLUsername: user, SASLPassword: pass})
			for _, extra := range [][]kgo.Opt{nil, {kgo.DisableIdempotentWrite()}} {
				err := produce(ctx, t, append(slices.Clone(o), extra...), topic)
				require.Error(t, err, "%s wrote to %s", user, topic)
				require.True(t, errors.Is(err, kerr.TopicAuthorizationFailed) || errors.Is(err, kerr.ClusterAuthorizationFailed),
					"%s: want an authorization error, got %v", user, err)
			}
		}
	})
}

// listener is one of the broker's listeners, with the users its PLAIN JAAS
// config lists and the login the broker itself uses on it.
type listener struct {
	name     string
	port     string
	protocol string
	users    map[string]string // user_NAME="password"
	self     struct{ user, pass string }
}

// kafkaBroker returns the one service that runs Apache Kafka as a broker.
func kafkaBroker(t *testing.T, p *types.Project) types.ServiceConfig {
	t.Helper()
	var found []types.ServiceConfig
	for _, s := range p.Services {
		if strings.HasPrefix(s.Image, "apache/kafka:") && envOf(s)["KAFKA_PROCESS_ROLES"] != "" {
			found = append(found, s)
		}
	}
	require.Len(t, found, 1, "compose.yaml should run one Kafka broker")
	return found[0]
}

// aclJob returns the one service that runs kafka-acls.sh.
func aclJob(t *testing.T, p *types.Project) types.ServiceConfig {
	t.Helper()
	var found []types.ServiceConfig
	for _, s := range p.Services {
		if strings.Contains(strings.Join(append(slices.Clone([]string(s.Entrypoint)), s.Command...), " "), "kafka-acls.sh") {
			found = append(found, s)
		}
	}
	require.Len(t, found, 1, "compose.yaml should create the Kafka ACLs in one service (kafka-acls.sh)")
	return found[0]
}

func envOf(s types.ServiceConfig) map[string]string {
	env := map[string]string{}
	for k, v := range s.Environment {
		if v != nil {
			env[k] = *v
		}
	}
	return env
}

var jaasOption = regexp.MustCompile(`(\w+)="([^"]*)"`)

// kafkaListeners reads the broker's listeners, their security protocols
// and PLAIN users.
func kafkaListeners(t *testing.T, env map[string]string) map[string]listener {
	t.Helper()
	protocols := map[string]string{}
	for _, kv := range strings.Split(env["KAFKA_LISTENER_SECURITY_PROTOCOL_MAP"], ",") {
		k, v, ok := strings.Cut(kv, ":")
		require.True(t, ok, "KAFKA_LISTENER_SECURITY_PROTOCOL_MAP: %q", kv)
		protocols[k] = v
	}
	out := map[string]listener{}
	for _, spec := range strings.Split(env["KAFKA_LISTENERS"], ",") {
		name, addr, ok := strings.Cut(spec, "://")
		require.True(t, ok, "KAFKA_LISTENERS: %q", spec)
		_, port, err := net.SplitHostPort(addr)
		require.NoError(t, err, "KAFKA_LISTENERS: %q", spec)
		l := listener{name: name, port: port, protocol: protocols[name], users: map[string]string{}}
		require.NotEmpty(t, l.protocol, "listener %s has no security protocol", name)
		for _, m := range jaasOption.FindAllStringSubmatch(env["KAFKA_LISTENER_NAME_"+name+"_PLAIN_SASL_JAAS_CONFIG"], -1) {
			switch key, val := m[1], m[2]; {
			case key == "username":
				l.self.user = val
			case key == "password":
				l.self.pass = val
			case strings.HasPrefix(key, "user_"):
				l.users[strings.TrimPrefix(key, "user_")] = val
			}
		}
		out[name] = l
	}
	require.NotEmpty(t, out, "KAFKA_LISTENERS is empty")
	return out
}

// listenerFor returns the listener a client reaches at addr (host:port),
// by port.
func listenerFor(t *testing.T, listeners map[string]listener, addr string) listener {
	t.Helper()
	_, port, err := net.SplitHostPort(addr)
	require.NoError(t, err, "broker address %q", addr)
	for _, l := range listeners {
		if l.port == port {
			return l
		}
	}
	require.Failf(t, "no listener", "%s reaches no listener of the broker", addr)
	return listener{}
}

// kafkaClient is a service of the project image that talks to Kafka.
type kafkaClient struct {
	service string
	env     map[string]string
	broker  string // the first of KAFKA_BROKERS
	conn    kafkaconf.Config
}

// kafkaClients returns the services that set KAFKA_BROKERS, by binary.
func kafkaClients(t *testing.T, p *types.Project) map[string][]kafkaClient {
	t.Helper()
	out := map[string][]kafkaClient{}
	for _, inv := range composetest.Invocations(t, p) {
		brokers := inv.Env["KAFKA_BROKERS"]
		if inv.Role != "command" || brokers == "" {
			continue
		}
		out[inv.Binary] = append(out[inv.Binary], kafkaClient{
			service: inv.Service,
			env:     inv.Env,
			broker:  strings.TrimSpace(strings.Split(brokers, ",")[0]),
			conn: kafkaconf.Config{
				SASLMechanism: strings.ToUpper(inv.Env["KAFKA_SASL_MECHANISM"]),
				SASLUsername:  inv.Env["KAFKA_SASL_USERNAME"],
				SASLPassword:  inv.Env["KAFKA_SASL_PASSWORD"],
			},
		})
	}
	return out
}

// adminConfig is the admin client config the ACL job passes to
// kafka-acls.sh with --command-config.
type adminConfig struct {
	config    string // the compose config's name
	broker    string // --bootstrap-server
	mechanism string
	user      string
	pass      string
}

func adminClientConfig(t *testing.T, p *types.Project, job types.ServiceConfig) adminConfig {
	t.Helper()
	script := strings.Join(job.Command, "\n")
	m := regexp.MustCompile(`--bootstrap-server\s+(\S+)\s+--command-config\s+(\S+)`).FindStringSubmatch(script)
	require.NotNil(t, m, "service %s: kafka-acls.sh must be called with --bootstrap-server ADDR --command-config FILE", job.Name)
	var a adminConfig
	a.broker = m[1]
	for _, c := range job.Configs {
		if c.Target == m[2] {
			a.config = c.Source
		}
	}
	require.NotEmpty(t, a.config, "service %s: --command-config %s is not one of its configs", job.Name, m[2])
	cfg, ok := p.Configs[a.config]
	require.True(t, ok, "config %s is not defined", a.config)
	props := map[string]string{}
	for _, line := range strings.Split(cfg.Content, "\n") {
		if k, v, ok := strings.Cut(strings.TrimSpace(line), "="); ok && !strings.HasPrefix(k, "#") {
			props[strings.TrimSpace(k)] = strings.TrimSpace(v)
		}
	}
	require.Equal(t, "SASL_PLAINTEXT", props["security.protocol"], "config %s", a.config)
	a.mechanism = props["sasl.mechanism"]
	for _, o := range jaasOption.FindAllStringSubmatch(props["sasl.jaas.config"], -1) {
		switch o[1] {
		case "username":
			a.user = o[2]
		case "password":
			a.pass = o[2]
		}
	}
	require.Equal(t, kafkaconf.Plain, a.mechanism, "config %s: sasl.mechanism", a.config)
	require.NotEmpty(t, a.user, "config %s: sasl.jaas.config has no username", a.config)
	return a
}

// configTarget returns where service s mounts config name.
func configTarget(t *testing.T, s types.ServiceConfig, name string) string {
	t.Helper()
	for _, c := range s.Configs {
		if c.Source == name {
			return c.Target
		}
	}
	require.Failf(t, "config not mounted", "service %s does not mount config %s", s.Name, name)
	return ""
}

// aclLine is one ACL the job adds: one principal allowed some operations
// on one literal resource.
type aclLine struct {
	line      string
	principal string
	ops       []kmsg.ACLOperation
	resource  kmsg.ACLResourceType
	name      string
}

// parseACLs reads the job's `kafka-acls.sh --add` calls, one a line. An
// option it does not know fails the test rather than being skipped, so
// that a deny, a prefixed pattern or a host restriction is not silently
// read as something else.
func parseACLs(t *testing.T, job types.ServiceConfig) []aclLine {
	t.Helper()
	var out []aclLine
	for _, line := range strings.Split(strings.Join(job.Command, "\n"), "\n") {
		f := strings.Fields(line)
		if !slices.Contains(f, "--add") {
			continue
		}
		a := aclLine{line: strings.TrimSpace(line)}
		i := slices.Index(f, "--add") + 1
		next := func() string {
			i++
			require.Less(t, i, len(f), "%s: %s needs a value", a.line, f[i-1])
			return f[i]
		}
		for ; i < len(f); i++ {
			switch f[i] {
			case "--allow-principal":
				require.Empty(t, a.principal, "%s: one principal a line", a.line)
				a.principal = next()
			case "--operation":
				op, err := kmsg.ParseACLOperation(next())
				require.NoError(t, err, a.line)
				a.ops = append(a.ops, op)
			case "--topic", "--group":
				require.Zero(t, a.resource, "%s: one resource a line", a.line)
				a.resource = kmsg.ACLResourceTypeTopic
				if f[i] == "--group" {
					a.resource = kmsg.ACLResourceTypeGroup
				}
				a.name = next()
			case "--cluster":
				require.Zero(t, a.resource, "%s: one resource a line", a.line)
				a.resource = kmsg.ACLResourceTypeCluster
			default:
				require.Failf(t, "unknown kafka-acls option", "%s: %s", a.line, f[i])
			}
		}
		require.True(t, strings.HasPrefix(a.principal, "User:"), "%s: the principal must be User:NAME", a.line)
		require.NotEmpty(t, a.ops, "%s: no --operation", a.line)
		require.NotZero(t, a.resource, "%s: no resource", a.line)
		out = append(out, a)
	}
	require.NotEmpty(t, out, "service %s adds no ACL (kafka-acls.sh --add)", job.Name)
	return out
}

func newClient(t *testing.T, opts []kgo.Opt) *kgo.Client {
	t.Helper()
	cl, err := kgo.NewClient(opts...)
	require.NoError(t, err)
	t.Cleanup(cl.Close)
	return cl
}

// produce writes one record to topic, acknowledged by all in-sync
// replicas as the relay asks.
func produce(ctx context.Context, t *testing.T, opts []kgo.Opt, topic string) error {
	t.Helper()
	cl, err := kgo.NewClient(append(slices.Clone(opts), kgo.RequiredAcks(kgo.AllISRAcks()), kgo.RecordRetries(1))...)
	require.NoError(t, err)
	defer cl.Close()
	pctx, cancel := context.WithTimeout(ctx, 5*time.Second)
	defer cancel()
	return cl.ProduceSync(pctx, &kgo.Record{Topic: topic, Key: []byte("k"), Value: []byte("v")}).FirstErr()
}

// consume joins group, reads a record of topic and commits its offset, as
// the notifier does (auto-commit off).
func consume(ctx context.Context, t *testing.T, opts []kgo.Opt, group, topic string) error {
	t.Helper()
	cl, err := kgo.NewClient(append(slices.Clone(opts),
		kgo.ConsumerGroup(group),
		kgo.ConsumeTopics(topic),
		kgo.ConsumeResetOffset(kgo.NewOffset().AtStart()),
		kgo.DisableAutoCommit(),
	)...)
	require.NoError(t, err)
	defer cl.Close()
	cctx, cancel := context.WithTimeout(ctx, 10*time.Second)
	defer cancel()
	for {
		fs := cl.PollFetches(cctx)
		if err := fs.Err(); err != nil {
			return err
		}
		if fs.NumRecords() > 0 {
			return cl.CommitUncommittedOffsets(cctx)
		}
	}
}
