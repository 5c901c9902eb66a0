package main

import (
	"fmt"
	"io"
	"log/slog"
	"sort"
	"strings"
	"time"

	"github.com/outboxref/orders/internal/auth"
	"github.com/outboxref/orders/internal/debugserver"
	"github.com/outboxref/orders/internal/envconfig"
	"github.com/outboxref/orders/internal/kafkaconf"
	"github.com/outboxref/orders/internal/outbox/relay"
)

// Config is the orders service's whole configuration, read from the
// environment. Defaults suit the local demo.
type Config struct {
	DatabaseURL     string        // DATABASE_URL
	HTTPAddr        string        // HTTP_ADDR
	Tokens          *auth.Tokens  // AUTH_TOKENS: token=subject:role,...
	ShutdownTimeout time.Duration // SHUTDOWN_TIMEOUT
	LogLevel        slog.Level    // LOG_LEVEL: debug, info, warn or error
	DebugAddr       string        // DEBUG_ADDR: pprof on a private listener; off when empty

	Kafka   KafkaConfig
	Relay   RelayConfig
	Ops     OperationsConfig
	Console ConsoleConfig
}

// KafkaConfig is how the relay reaches the broker and what it produces.
type KafkaConfig struct {
	Conn            kafkaconf.Config // KAFKA_BROKERS, KAFKA_TLS, KAFKA_TLS_CA_FILE, KAFKA_SASL_*
	Topic           string           // ORDERS_TOPIC
	TopicPartitions int              // ORDERS_TOPIC_PARTITIONS
	// ProduceTimeout is the deadline of each send (R5a): at most half of
	// RELAY_LEASE, and by default the smaller of 10s and RELAY_LEASE/2.
	ProduceTimeout time.Duration // KAFKA_PRODUCE_TIMEOUT: deadline of one batch, counted from its claim
	// MaxMessageBytes is the largest record batch the producer builds; set
	// it to the topic's max.message.bytes. Larger events are parked.
	MaxMessageBytes int // KAFKA_MAX_MESSAGE_BYTES
}

// RelayConfig tunes the embedded outbox relay.
type RelayConfig struct {
	Enabled      bool          // RELAY_ENABLED
	BatchSize    int           // RELAY_BATCH_SIZE
	Lease        time.Duration // RELAY_LEASE
	PollInterval time.Duration // RELAY_POLL_INTERVAL
	BackoffBase  time.Duration // RELAY_BACKOFF_BASE
	BackoffCap   time.Duration // RELAY_BACKOFF_CAP
	// DrainTimeout is how long a stopping relay waits for the broker to
	// answer records already sent before it releases their leases (R9).
	DrainTimeout time.Duration // RELAY_DRAIN_TIMEOUT
	// Source is the CloudEvents source (ce_source) of every event.
	Source string // RELAY_CE_SOURCE
	// MetricsAddr is where `orders relay` serves /metrics, /healthz and
	// /readyz; `orders serve` exposes them on HTTP_ADDR instead.
	MetricsAddr string // RELAY_METRICS_ADDR
}

// defaultDatabaseURL suits the local demo; `migrate` and `serve` share it.
const defaultDatabaseURL = "postgres://postgres@127.0.0.1:5432/orders?sslmode=disable"

// defaultHTTPAddr is where `orders serve` listens, and so where
// `orders healthcheck` probes, unless HTTP_ADDR says otherwise.
const defaultHTTPAddr = ":8080"

// loadMigrateConfig reads the one setting of `orders migrate`.
func loadMigrateConfig(getenv func(string) string) string {
	return envconfig.New(getenv).String("DATABASE_URL", defaultDatabaseURL)
}

// loadHealthcheckConfig reads where `orders healthcheck` finds the
// server: HTTP_ADDR, with the same default as `orders serve`.
func loadHealthcheckConfig(getenv func(string) string) string {
	return envconfig.New(getenv).String("HTTP_ADDR", defaultHTTPAddr)
}

const defaultDevTokens = "" // no default: tokens are secrets and must be configured

// loadConfig reads the configuration of `orders serve`.
func loadConfig(getenv func(string) string) (Config, error) { return load(getenv, true) }

// loadRelayConfig reads the configuration of `orders relay`, which serves
// no API and so needs no AUTH_TOKENS.
func loadRelayConfig(getenv func(string) string) (Config, error) { return load(getenv, false) }

func load(getenv func(string) string, api bool) (Config, error) {
	r := envconfig.New(getenv)
	c := Config{
		DatabaseURL:     r.String("DATABASE_URL", defaultDatabaseURL),
		HTTPAddr:        r.String("HTTP_ADDR", defaultHTTPAddr),
		ShutdownTimeout: r.Duration("SHUTDOWN_TIMEOUT", 20*time.Second),
		LogLevel:        r.LogLevel("LOG_LEVEL", slog.LevelInfo),
		DebugAddr:       r.String("DEBUG_ADDR", ""),
		Kafka: KafkaConfig{
			Conn: kafkaconf.Config{
				Brokers:       r.List("KAFKA_BROKERS", "127.0.0.1:9092"),
				TLS:           r.Bool("KAFKA_TLS", false),
				TLSCAFile:     r.String("KAFKA_TLS_CA_FILE", ""),
				SASLMechanism: strings.ToUpper(r.String("KAFKA_SASL_MECHANISM", "")),
				SASLUsername:  r.String("KAFKA_SASL_USERNAME", ""),
				SASLPassword:  r.String("KAFKA_SASL_PASSWORD", ""),
			},
			Topic:           r.String("ORDERS_TOPIC", "orders.events"),
			TopicPartitions: r.Int("ORDERS_TOPIC_PARTITIONS", 6, 1, 10000),
			MaxMessageBytes: r.Int("KAFKA_MAX_MESSAGE_BYTES", relay.DefaultMaxMessageBytes, 512, 1<<30),
		},
		Relay: RelayConfig{
			Enabled:      r.Bool("RELAY_ENABLED", true),
			BatchSize:    r.Int("RELAY_BATCH_SIZE", 100, 1, 10000),
			Lease:        r.Duration("RELAY_LEASE", 30*time.Second),
			PollInterval: r.Duration("RELAY_POLL_INTERVAL", time.Second),
			BackoffBase:  r.Duration("RELAY_BACKOFF_BASE", 500*time.Millisecond),
			BackoffCap:   r.Duration("RELAY_BACKOFF_CAP", 5*time.Minute),
			DrainTimeout: r.Duration("RELAY_DRAIN_TIMEOUT", 0), // default set below from the produce timeout
			Source:       r.String("RELAY_CE_SOURCE", "urn:outboxref:orders"),
			MetricsAddr:  r.String("RELAY_METRICS_ADDR", ":9091"),
		},
	}
	c.Ops = loadOperations(r)
	if api {
		c.Console = loadConsole(r)
	}
	// The produce deadline defaults to 10s but never more than half the
	// lease (R5a), so that shortening RELAY_LEASE alone stays valid.
	c.Kafka.ProduceTimeout = r.Duration("KAFKA_PRODUCE_TIMEOUT", min(10*time.Second, c.Relay.Lease/2))
	if c.Relay.DrainTimeout == 0 {
		// Waiting longer than a send may take is pointless on shutdown.
		c.Relay.DrainTimeout = min(5*time.Second, c.Kafka.ProduceTimeout)
	}
	if c.Kafka.ProduceTimeout > c.Relay.Lease/2 {
		r.Fail("KAFKA_PRODUCE_TIMEOUT (%s) must not exceed half of RELAY_LEASE (%s): a send must end well before its lease", c.Kafka.ProduceTimeout, c.Relay.Lease)
	}
	if spec := r.String("AUTH_TOKENS", defaultDevTokens); spec == "" && !api {
		// Not needed: the relay alone has no authenticated endpoints.
	} else if spec == "" {
		r.Fail("AUTH_TOKENS is required: token=subject:role,... with roles customer, admin, service, viewer")
	} else if t, err := auth.ParseTokens(spec); err != nil {
		r.Fail("AUTH_TOKENS: %v", err)
	} else {
		c.Tokens = t
	}
	if err := c.Kafka.Conn.Validate(); err != nil {
		r.Fail("KAFKA_*: %v", err)
	}
	if err := debugserver.CheckAddr(c.DebugAddr, c.HTTPAddr, c.Relay.MetricsAddr); err != nil {
		r.Fail("DEBUG_ADDR=%v", err)
	}
	if c.Relay.BackoffCap < c.Relay.BackoffBase {
		r.Fail("RELAY_BACKOFF_CAP (%s) must not be below RELAY_BACKOFF_BASE (%s)", c.Relay.BackoffCap, c.Relay.BackoffBase)
	}
	if err := r.Err(); err != nil {
		return Config{}, fmt.Errorf("invalid configuration:\n%w", err)
	}
	return c, nil
}

// print writes the configuration with secrets masked.
func (c Config) print(w io.Writer) {
	tokens := "(not used)"
	if c.Tokens != nil {
		subjects := c.Tokens.Subjects()
		sort.Strings(subjects)
		tokens = fmt.Sprintf("[%d tokens: %s]", c.Tokens.Len(), strings.Join(subjects, " "))
	}
	fmt.Fprintf(w, "config: DATABASE_URL=%s HTTP_ADDR=%s AUTH_TOKENS=%s SHUTDOWN_TIMEOUT=%s\n",
		envconfig.MaskURL(c.DatabaseURL), c.HTTPAddr, tokens, c.ShutdownTimeout)
	fmt.Fprintf(w, "config: KAFKA_BROKERS=%s ORDERS_TOPIC=%s ORDERS_TOPIC_PARTITIONS=%d KAFKA_TLS=%t KAFKA_TLS_CA_FILE=%s KAFKA_SASL_MECHANISM=%s KAFKA_SASL_USERNAME=%s KAFKA_SASL_PASSWORD=%s KAFKA_PRODUCE_TIMEOUT=%s KAFKA_MAX_MESSAGE_BYTES=%d\n",
		strings.Join(c.Kafka.Conn.Brokers, ","), c.Kafka.Topic, c.Kafka.TopicPartitions, c.Kafka.Conn.TLS, c.Kafka.Conn.TLSCAFile, c.Kafka.Conn.SASLMechanism, c.Kafka.Conn.SASLUsername, envconfig.Mask(c.Kafka.Conn.SASLPassword),
		c.Kafka.ProduceTimeout, c.Kafka.MaxMessageBytes)
	fmt.Fprintf(w, "config: RELAY_ENABLED=%t RELAY_BATCH_SIZE=%d RELAY_LEASE=%s RELAY_POLL_INTERVAL=%s RELAY_BACKOFF_BASE=%s RELAY_BACKOFF_CAP=%s RELAY_DRAIN_TIMEOUT=%s RELAY_CE_SOURCE=%s RELAY_METRICS_ADDR=%s\n",
		c.Relay.Enabled, c.Relay.BatchSize, c.Relay.Lease, c.Relay.PollInterval, c.Relay.BackoffBase, c.Relay.BackoffCap,
		c.Relay.DrainTimeout, c.Relay.Source, c.Relay.MetricsAddr)
	c.Ops.print(w)
	if c.Tokens != nil {
		c.Console.print(w)
	}
	fmt.Fprintf(w, "config: LOG_LEVEL=%s DEBUG_ADDR=%s\n", envconfig.LevelName(c.LogLevel), c.DebugAddr)
}
