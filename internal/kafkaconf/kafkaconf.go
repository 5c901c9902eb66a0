// Package kafkaconf turns connection settings (brokers, TLS, SASL) into
// franz-go client options, so that every binary that talks to Kafka (the
// orders relay, the notifier) reaches a real cluster the same way.
//
// Only how to reach and authenticate to the cluster lives here. What a
// client does once connected (producer guarantees, consumer groups) belongs
// to the package that uses it.
package kafkaconf

import (
	"context"
	"crypto/tls"
	"crypto/x509"
	"errors"
	"fmt"
	"log/slog"
	"os"
	"strings"

	"github.com/twmb/franz-go/pkg/kgo"
	"github.com/twmb/franz-go/pkg/sasl"
	"github.com/twmb/franz-go/pkg/sasl/plain"
	"github.com/twmb/franz-go/pkg/sasl/scram"
)

// SASL mechanism names, as Kafka spells them.
const (
	ScramSHA256 = "SCRAM-SHA-256"
	ScramSHA512 = "SCRAM-SHA-512"
	Plain       = "PLAIN"
)

// Config is how a client reaches the cluster.
type Config struct {
	// Brokers are the seed brokers, host:port.
	Brokers []string
	// TLS dials the brokers with TLS 1.2 or newer. The server name is taken
	// from each broker's host.
	TLS bool
	// TLSCAFile is a PEM bundle of the CAs to trust; empty means the
	// system roots. Setting it implies TLS.
	TLSCAFile string
	// SASLMechanism is "", SCRAM-SHA-256, SCRAM-SHA-512 or PLAIN.
	SASLMechanism string
	SASLUsername  string
	SASLPassword  string
}

// Validate reports every problem with the settings at once.
func (c Config) Validate() error {
	var errs []error
	if len(c.Brokers) == 0 {
		errs = append(errs, errors.New("at least one broker address is required"))
	}
	switch strings.ToUpper(c.SASLMechanism) {
	case "":
	case ScramSHA256, ScramSHA512, Plain:
		if c.SASLUsername == "" || c.SASLPassword == "" {
			errs = append(errs, fmt.Errorf("SASL mechanism %s needs a username and a password", c.SASLMechanism))
		}
	default:
		errs = append(errs, fmt.Errorf("SASL mechanism %q: want %s, %s or %s", c.SASLMechanism, ScramSHA256, ScramSHA512, Plain))
	}
	return errors.Join(errs...)
}

// Options returns the client options for these settings: seed brokers, the
// TLS dialer and the SASL mechanism. Callers append their own options
// (producer or consumer settings) after these.
func (c Config) Options() ([]kgo.Opt, error) {
	if err := c.Validate(); err != nil {
		return nil, fmt.Errorf("kafka connection settings: %w", err)
	}
	opts := []kgo.Opt{kgo.SeedBrokers(c.Brokers...)}

	if c.TLS || c.TLSCAFile != "" {
		tc := &tls.Config{MinVersion: tls.VersionTLS12}
		if c.TLSCAFile != "" {
			pem, err := os.ReadFile(c.TLSCAFile)
			if err != nil {
				return nil, fmt.Errorf("read Kafka CA file: %w", err)
			}
			roots := x509.NewCertPool()
			if !roots.AppendCertsFromPEM(pem) {
				return nil, fmt.Errorf("Kafka CA file %s holds no PEM certificate", c.TLSCAFile)
			}
			tc.RootCAs = roots
		}
		opts = append(opts, kgo.DialTLSConfig(tc))
	}

	if m := c.mechanism(); m != nil {
		opts = append(opts, kgo.SASL(m))
	}
	return opts, nil
}

// mechanism builds the SASL mechanism. The credentials are captured in a
// closure that franz-go calls on every (re)authentication.
func (c Config) mechanism() sasl.Mechanism {
	user, pass := c.SASLUsername, c.SASLPassword
	switch strings.ToUpper(c.SASLMechanism) {
	case ScramSHA256:
		return scram.Auth{User: user, Pass: pass}.AsSha256Mechanism()
	case ScramSHA512:
		return scram.Auth{User: user, Pass: pass}.AsSha512Mechanism()
	case Plain:
		return plain.Auth{User: user, Pass: pass}.AsMechanism()
	default:
		return nil
	}
}

// String describes the settings with the password masked, for start-up
// logs.
func (c Config) String() string {
	pass := ""
	if c.SASLPassword != "" {
		pass = "xxxxx"
	}
	return fmt.Sprintf("brokers=%s tls=%t tls_ca_file=%s sasl_mechanism=%s sasl_username=%s sasl_password=%s",
		strings.Join(c.Brokers, ","), c.TLS || c.TLSCAFile != "", c.TLSCAFile, c.SASLMechanism, c.SASLUsername, pass)
}

// Logger adapts a slog.Logger to franz-go's logger. Only messages at level
// or above are passed on: franz-go's info level narrates every metadata
// refresh, which drowns a service log.
func Logger(l *slog.Logger, level kgo.LogLevel) kgo.Logger {
	return slogLogger{l: l, level: level}
}

type slogLogger struct {
	l     *slog.Logger
	level kgo.LogLevel
}

func (s slogLogger) Level() kgo.LogLevel { return s.level }

func (s slogLogger) Log(level kgo.LogLevel, msg string, keyvals ...any) {
	var sl slog.Level
	switch level {
	case kgo.LogLevelError:
		sl = slog.LevelError
	case kgo.LogLevelWarn:
		sl = slog.LevelWarn
	case kgo.LogLevelInfo:
		sl = slog.LevelInfo
	default:
		sl = slog.LevelDebug
	}
	s.l.Log(context.Background(), sl, "kafka client: "+msg, keyvals...)
}
