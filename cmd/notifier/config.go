package main

import (
	"crypto/tls"
	"crypto/x509"
	"fmt"
	"io"
	"log/slog"
	"net"
	"net/mail"
	"net/url"
	"os"
	"sort"
	"strings"
	"time"

	"github.com/outboxref/orders/internal/auth"
	"github.com/outboxref/orders/internal/debugserver"
	"github.com/outboxref/orders/internal/envconfig"
	"github.com/outboxref/orders/internal/inbox"
	"github.com/outboxref/orders/internal/kafkaconf"
	"github.com/outboxref/orders/internal/notify"
	"github.com/outboxref/orders/internal/outbox/cloudevents"
)

// Config is the notifier's whole configuration, read from the environment.
// Defaults suit the local demo.
type Config struct {
	DatabaseURL     string        // DATABASE_URL
	HTTPAddr        string        // HTTP_ADDR: /healthz, /readyz, /metrics
	ShutdownTimeout time.Duration // SHUTDOWN_TIMEOUT
	LogLevel        slog.Level    // LOG_LEVEL: debug, info, warn or error
	DebugAddr       string        // DEBUG_ADDR: pprof on a private listener; off when empty
	Tokens          *auth.Tokens  // AUTH_TOKENS: the admin API on HTTP_ADDR (admin role only); nil disables it

	Kafka KafkaConfig
	Email EmailConfig
	// Orders API, the source of truth for gap resync (C3).
	OrdersAPIURL     string        // ORDERS_API_URL
	OrdersAPIToken   string        // ORDERS_API_TOKEN: a service-role token
	OrdersAPITimeout time.Duration // ORDERS_API_TIMEOUT
	GapWindow        time.Duration // GAP_WINDOW: how long a gap is held before a resync
	// OrdersEventSource is the ce_source the orders service writes (its
	// RELAY_CE_SOURCE); a record with any other source is parked (C7).
	OrdersEventSource string // ORDERS_EVENT_SOURCE

	Retention RetentionConfig
}

// KafkaConfig is the consumer's side of the broker.
type KafkaConfig struct {
	Conn           kafkaconf.Config // KAFKA_BROKERS, KAFKA_TLS, KAFKA_TLS_CA_FILE, KAFKA_SASL_*
	Topic          string           // ORDERS_TOPIC (never created by the notifier)
	Group          string           // KAFKA_GROUP
	InstanceID     string           // KAFKA_INSTANCE_ID: static membership when set
	SessionTimeout time.Duration    // KAFKA_SESSION_TIMEOUT
	// StartOffset is where a group without committed offsets begins:
	// earliest (catch up on the topic's history) or latest.
	StartOffset string // KAFKA_START_OFFSET
	// BatchMax bounds the records applied in one local transaction; their
	// offsets are committed only after it commits (C1). 1 means one
	// transaction per record.
	BatchMax int // NOTIFIER_BATCH_MAX
}

// EmailConfig is the SMTP relay and the send ledger's policy (C4).
type EmailConfig struct {
	SMTPAddr       string               // SMTP_ADDR
	From           string               // SMTP_FROM
	HeloName       string               // SMTP_HELO_NAME
	SendTimeout    time.Duration        // SMTP_TIMEOUT: one send, dial (or reuse) to reply
	TLS            notify.TLSMode       // SMTP_TLS: none | starttls | tls
	TLSCAFile      string               // SMTP_TLS_CA_FILE: PEM bundle; empty means the system roots
	TLSServerName  string               // SMTP_TLS_SERVER_NAME: empty means the host of SMTP_ADDR
	Username       string               // SMTP_USERNAME
	Password       string               // SMTP_PASSWORD
	SendingTimeout time.Duration        // EMAIL_SENDING_TIMEOUT: 'sending' longer than this becomes unknown
	UnknownPolicy  notify.UnknownPolicy // EMAIL_UNKNOWN_POLICY: hold | resend
	MaxAttempts    int                  // EMAIL_MAX_ATTEMPTS
	BackoffBase    time.Duration        // EMAIL_BACKOFF_BASE
	BackoffCap     time.Duration        // EMAIL_BACKOFF_CAP
	PollInterval   time.Duration        // EMAIL_POLL_INTERVAL
	// MaxAge skips the email of an event older than this when it could
	// first be sent, so a new consumer group on a long topic does not
	// email its whole history (C4a).
	MaxAge time.Duration // EMAIL_MAX_AGE
	// Senders is how many emails are sent at once, each on a kept SMTP
	// connection of its own. One by default: a crash then leaves at most
	// one row in 'sending' (one per sender otherwise) for the sweep to
	// call unknown.
	Senders int // EMAIL_SENDERS
}

// RetentionConfig is the processed_event retention and its constraints (C5).
type RetentionConfig struct {
	ProcessedEventTTL      time.Duration // PROCESSED_EVENT_TTL
	BrokerRedeliveryWindow time.Duration // BROKER_REDELIVERY_WINDOW: the topic's retention, at least
	BackupRetention        time.Duration // BACKUP_RETENTION: age of the oldest restorable backup
	CleanupInterval        time.Duration // CLEANUP_INTERVAL
	CleanupBatch           int           // CLEANUP_BATCH
	CleanupPause           time.Duration // CLEANUP_PAUSE: between two batches
}

const defaultDatabaseURL = "postgres://postgres@127.0.0.1:5432/notifier?sslmode=disable"

// defaultHTTPAddr is where `notifier serve` listens, and so where
// `notifier healthcheck` probes, unless HTTP_ADDR says otherwise.
const defaultHTTPAddr = ":8081"

// loadMigrateConfig reads the one setting of `notifier migrate`.
func loadMigrateConfig(getenv func(string) string) string {
	return envconfig.New(getenv).String("DATABASE_URL", defaultDatabaseURL)
}

// loadHealthcheckConfig reads where `notifier healthcheck` finds the
// server: HTTP_ADDR, with the same default as `notifier serve`.
func loadHealthcheckConfig(getenv func(string) string) string {
	return envconfig.New(getenv).String("HTTP_ADDR", defaultHTTPAddr)
}

func loadConfig(getenv func(string) string) (Config, error) {
	r := envconfig.New(getenv)
	c := Config{
		DatabaseURL:     r.String("DATABASE_URL", defaultDatabaseURL),
		HTTPAddr:        r.String("HTTP_ADDR", defaultHTTPAddr),
		ShutdownTimeout: r.Duration("SHUTDOWN_TIMEOUT", 45*time.Second),
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
			Topic:          r.String("ORDERS_TOPIC", "orders.events"),
			Group:          r.String("KAFKA_GROUP", "notifier"),
			InstanceID:     r.String("KAFKA_INSTANCE_ID", ""),
			SessionTimeout: r.Duration("KAFKA_SESSION_TIMEOUT", 15*time.Second),
			StartOffset:    strings.ToLower(r.String("KAFKA_START_OFFSET", "earliest")),
			// The upper bound keeps a batch's transaction, and the inbox row
			// locks it holds, well inside its 30 s deadline.
			BatchMax: r.Int("NOTIFIER_BATCH_MAX", notify.DefaultMaxBatchRecords, 1, 2000),
		},
		Email: EmailConfig{
			SMTPAddr:       r.String("SMTP_ADDR", "127.0.0.1:1025"),
			From:           r.String("SMTP_FROM", "orders@outboxref.local"),
			HeloName:       r.String("SMTP_HELO_NAME", "notifier.outboxref.local"),
			SendTimeout:    r.Duration("SMTP_TIMEOUT", 30*time.Second),
			TLS:            notify.TLSMode(strings.ToLower(r.String("SMTP_TLS", string(notify.TLSNone)))),
			TLSCAFile:      r.String("SMTP_TLS_CA_FILE", ""),
			TLSServerName:  r.String("SMTP_TLS_SERVER_NAME", ""),
			Username:       r.String("SMTP_USERNAME", ""),
			Password:       r.String("SMTP_PASSWORD", ""),
			SendingTimeout: r.Duration("EMAIL_SENDING_TIMEOUT", 5*time.Minute),
			UnknownPolicy:  notify.UnknownPolicy(strings.ToLower(r.String("EMAIL_UNKNOWN_POLICY", string(notify.PolicyHold)))),
			MaxAttempts:    r.Int("EMAIL_MAX_ATTEMPTS", 10, 1, 1000),
			BackoffBase:    r.Duration("EMAIL_BACKOFF_BASE", time.Second),
			BackoffCap:     r.Duration("EMAIL_BACKOFF_CAP", 10*time.Minute),
			PollInterval:   r.Duration("EMAIL_POLL_INTERVAL", time.Second),
			MaxAge:         r.Duration("EMAIL_MAX_AGE", 24*time.Hour),
			Senders:        r.Int("EMAIL_SENDERS", 1, 1, 64),
		},
		OrdersAPIURL:      r.String("ORDERS_API_URL", "http://127.0.0.1:8080"),
		OrdersAPIToken:    r.String("ORDERS_API_TOKEN", ""),
		OrdersAPITimeout:  r.Duration("ORDERS_API_TIMEOUT", 5*time.Second),
		GapWindow:         r.Duration("GAP_WINDOW", 30*time.Second),
		OrdersEventSource: r.String("ORDERS_EVENT_SOURCE", notify.DefaultSource),
		Retention: RetentionConfig{
			ProcessedEventTTL:      r.Duration("PROCESSED_EVENT_TTL", 30*24*time.Hour),
			BrokerRedeliveryWindow: r.Duration("BROKER_REDELIVERY_WINDOW", 7*24*time.Hour),
			BackupRetention:        r.Duration("BACKUP_RETENTION", 14*24*time.Hour),
			CleanupInterval:        r.Duration("CLEANUP_INTERVAL", time.Hour),
			CleanupBatch:           r.Int("CLEANUP_BATCH", 1000, 1, 100_000),
			CleanupPause:           r.Duration("CLEANUP_PAUSE", 100*time.Millisecond),
		},
	}

	if err := c.Kafka.Conn.Validate(); err != nil {
		r.Fail("KAFKA_*: %v", err)
	}
	if c.Kafka.StartOffset != "earliest" && c.Kafka.StartOffset != "latest" {
		r.Fail("KAFKA_START_OFFSET=%q: want earliest or latest", c.Kafka.StartOffset)
	}
	if c.OrdersAPIToken == "" {
		r.Fail("ORDERS_API_TOKEN is required: a service-role token of the orders API, used to resynchronise gaps")
	}
	if u, err := url.Parse(c.OrdersAPIURL); err != nil || (u.Scheme != "http" && u.Scheme != "https") || u.Host == "" {
		r.Fail("ORDERS_API_URL=%q: want an http(s) URL", c.OrdersAPIURL)
	}
	if a, err := mail.ParseAddress(c.Email.From); err != nil || a.Name != "" {
		r.Fail("SMTP_FROM=%q: want a bare email address such as orders@example.com", c.Email.From)
	}
	checkSMTP(r, c.Email)
	switch c.Email.UnknownPolicy {
	case notify.PolicyHold, notify.PolicyResend:
	default:
		r.Fail("EMAIL_UNKNOWN_POLICY=%q: want hold or resend", c.Email.UnknownPolicy)
	}
	// A live send must never be declared dead by the sweep: the sending
	// timeout leaves the send timeout a wide margin.
	if c.Email.SendingTimeout < 2*c.Email.SendTimeout {
		r.Fail("EMAIL_SENDING_TIMEOUT (%s) must be at least twice SMTP_TIMEOUT (%s), or a slow send could be declared unknown while it is still running",
			c.Email.SendingTimeout, c.Email.SendTimeout)
	}
	if c.Email.BackoffCap < c.Email.BackoffBase {
		r.Fail("EMAIL_BACKOFF_CAP (%s) must not be below EMAIL_BACKOFF_BASE (%s)", c.Email.BackoffCap, c.Email.BackoffBase)
	}
	if c.ShutdownTimeout <= c.Email.SendTimeout {
		r.Fail("SHUTDOWN_TIMEOUT (%s) must exceed SMTP_TIMEOUT (%s) so the email in flight can finish", c.ShutdownTimeout, c.Email.SendTimeout)
	}
	if err := inbox.CheckRetention(c.Retention.ProcessedEventTTL, c.Retention.BrokerRedeliveryWindow, c.Retention.BackupRetention); err != nil {
		r.Fail("PROCESSED_EVENT_TTL=%s is shorter than BROKER_REDELIVERY_WINDOW (%s) + BACKUP_RETENTION (%s): %v",
			c.Retention.ProcessedEventTTL, c.Retention.BrokerRedeliveryWindow, c.Retention.BackupRetention, err)
	}
	if !cloudevents.ValidText(c.OrdersEventSource, cloudevents.MaxSourceBytes) {
		r.Fail("ORDERS_EVENT_SOURCE=%q: want the orders service's RELAY_CE_SOURCE, printable text", c.OrdersEventSource)
	}
	if c.Email.MaxAge <= 0 {
		r.Fail("EMAIL_MAX_AGE=%s must be positive", c.Email.MaxAge)
	}
	// Optional: without tokens the admin API answers 404 and nothing else
	// changes, so existing deployments keep starting.
	if spec := r.String("AUTH_TOKENS", ""); spec != "" {
		if t, err := auth.ParseTokens(spec); err != nil {
			r.Fail("AUTH_TOKENS: %v", err)
		} else {
			c.Tokens = t
		}
	}
	if err := debugserver.CheckAddr(c.DebugAddr, c.HTTPAddr); err != nil {
		r.Fail("DEBUG_ADDR=%v", err)
	}
	if err := r.Err(); err != nil {
		return Config{}, fmt.Errorf("invalid configuration:\n%w", err)
	}
	return c, nil
}

// checkSMTP validates how the relay is reached. Credentials go over TLS
// only: a password sent in clear is readable by anyone on the path, so
// SMTP_TLS=none with credentials is refused rather than silently honoured.
func checkSMTP(r *envconfig.Reader, e EmailConfig) {
	host, _, err := net.SplitHostPort(e.SMTPAddr)
	if err != nil {
		r.Fail("SMTP_ADDR=%q: want host:port", e.SMTPAddr)
	}
	if (e.Username == "") != (e.Password == "") {
		r.Fail("SMTP_USERNAME and SMTP_PASSWORD go together: set both or neither")
	}
	switch e.TLS {
	case notify.TLSNone:
		if e.Username != "" || e.Password != "" {
			r.Fail("SMTP_USERNAME and SMTP_PASSWORD need SMTP_TLS=starttls or SMTP_TLS=tls: credentials are never sent over a plain connection")
		}
		if e.TLSCAFile != "" || e.TLSServerName != "" {
			r.Fail("SMTP_TLS_CA_FILE and SMTP_TLS_SERVER_NAME need SMTP_TLS=starttls or SMTP_TLS=tls")
		}
	case notify.TLSStartTLS, notify.TLSImplicit:
		if err == nil && host == "" && e.TLSServerName == "" {
			r.Fail("SMTP_ADDR=%q has no host to verify the relay's certificate against: set SMTP_TLS_SERVER_NAME", e.SMTPAddr)
		}
		if e.TLSCAFile != "" {
			if _, err := loadCAFile(e.TLSCAFile); err != nil {
				r.Fail("SMTP_TLS_CA_FILE: %v", err)
			}
		}
	default:
		r.Fail("SMTP_TLS=%q: want none, starttls or tls", e.TLS)
	}
}

// mailer builds the SMTP client the settings describe. The caller closes
// it, which ends its cached connection.
func (e EmailConfig) mailer() (*notify.SMTPMailer, error) {
	m := &notify.SMTPMailer{Addr: e.SMTPAddr, HeloName: e.HeloName, Timeout: e.SendTimeout,
		TLS: e.TLS, Username: e.Username, Password: e.Password, MaxIdle: e.Senders}
	if e.TLS == notify.TLSNone {
		return m, nil
	}
	m.TLSConfig = &tls.Config{MinVersion: tls.VersionTLS12, ServerName: e.TLSServerName}
	if e.TLSCAFile != "" {
		roots, err := loadCAFile(e.TLSCAFile)
		if err != nil {
			return nil, fmt.Errorf("SMTP_TLS_CA_FILE: %w", err)
		}
		m.TLSConfig.RootCAs = roots
	}
	return m, nil
}

// loadCAFile reads a PEM bundle of CA certificates.
func loadCAFile(path string) (*x509.CertPool, error) {
	pem, err := os.ReadFile(path)
	if err != nil {
		return nil, fmt.Errorf("read CA file: %w", err)
	}
	roots := x509.NewCertPool()
	if !roots.AppendCertsFromPEM(pem) {
		return nil, fmt.Errorf("%s holds no PEM certificate", path)
	}
	return roots, nil
}

// print writes the configuration with secrets masked.
func (c Config) print(w io.Writer) {
	fmt.Fprintf(w, "config: DATABASE_URL=%s HTTP_ADDR=%s SHUTDOWN_TIMEOUT=%s\n",
		envconfig.MaskURL(c.DatabaseURL), c.HTTPAddr, c.ShutdownTimeout)
	fmt.Fprintf(w, "config: kafka %s ORDERS_TOPIC=%s KAFKA_GROUP=%s KAFKA_INSTANCE_ID=%s KAFKA_SESSION_TIMEOUT=%s KAFKA_START_OFFSET=%s NOTIFIER_BATCH_MAX=%d\n",
		c.Kafka.Conn, c.Kafka.Topic, c.Kafka.Group, c.Kafka.InstanceID, c.Kafka.SessionTimeout, c.Kafka.StartOffset, c.Kafka.BatchMax)
	fmt.Fprintf(w, "config: SMTP_ADDR=%s SMTP_TLS=%s SMTP_TLS_CA_FILE=%s SMTP_TLS_SERVER_NAME=%s SMTP_USERNAME=%s SMTP_PASSWORD=%s\n",
		c.Email.SMTPAddr, c.Email.TLS, c.Email.TLSCAFile, c.Email.TLSServerName, c.Email.Username, envconfig.Mask(c.Email.Password))
	fmt.Fprintf(w, "config: SMTP_FROM=%s SMTP_HELO_NAME=%s SMTP_TIMEOUT=%s EMAIL_SENDING_TIMEOUT=%s EMAIL_UNKNOWN_POLICY=%s EMAIL_MAX_ATTEMPTS=%d EMAIL_BACKOFF_BASE=%s EMAIL_BACKOFF_CAP=%s EMAIL_POLL_INTERVAL=%s EMAIL_MAX_AGE=%s EMAIL_SENDERS=%d\n",
		c.Email.From, c.Email.HeloName, c.Email.SendTimeout, c.Email.SendingTimeout, c.Email.UnknownPolicy, c.Email.MaxAttempts, c.Email.BackoffBase, c.Email.BackoffCap, c.Email.PollInterval, c.Email.MaxAge, c.Email.Senders)
	fmt.Fprintf(w, "config: ORDERS_API_URL=%s ORDERS_API_TOKEN=%s ORDERS_API_TIMEOUT=%s GAP_WINDOW=%s ORDERS_EVENT_SOURCE=%s\n",
		envconfig.MaskURL(c.OrdersAPIURL), envconfig.Mask(c.OrdersAPIToken), c.OrdersAPITimeout, c.GapWindow, c.OrdersEventSource)
	fmt.Fprintf(w, "config: PROCESSED_EVENT_TTL=%s BROKER_REDELIVERY_WINDOW=%s BACKUP_RETENTION=%s CLEANUP_INTERVAL=%s CLEANUP_BATCH=%d CLEANUP_PAUSE=%s\n",
		c.Retention.ProcessedEventTTL, c.Retention.BrokerRedeliveryWindow, c.Retention.BackupRetention, c.Retention.CleanupInterval, c.Retention.CleanupBatch, c.Retention.CleanupPause)
	fmt.Fprintf(w, "config: LOG_LEVEL=%s DEBUG_ADDR=%s\n", envconfig.LevelName(c.LogLevel), c.DebugAddr)
	tokens := "(unset: admin API disabled)"
	if c.Tokens != nil {
		subjects := c.Tokens.Subjects()
		sort.Strings(subjects)
		tokens = fmt.Sprintf("[%d tokens: %s]", c.Tokens.Len(), strings.Join(subjects, " "))
	}
	fmt.Fprintf(w, "config: AUTH_TOKENS=%s\n", tokens)
}
