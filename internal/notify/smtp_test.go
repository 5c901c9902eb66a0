package notify

import (
	"context"
	"crypto/tls"
	"fmt"
	"sync"
	"testing"
	"time"

	"github.com/emersion/go-sasl"
	"github.com/stretchr/testify/require"

	"github.com/outboxref/orders/internal/notify/smtptest"
)

// TestSMTPMailer covers the mailer against a real SMTP server in process:
// TLS and AUTH as a provider requires them, the refusals that keep
// credentials and mail off a plain connection, connection reuse, and the
// classification the send ledger relies on (C4).
func TestSMTPMailer(t *testing.T) {
	t.Parallel()
	const from, to = "orders@shop.test", "alice@example.com"
	var seq sync.Mutex
	n := 0
	message := func() []byte {
		seq.Lock()
		defer seq.Unlock()
		n++
		return fmt.Appendf(nil, "Message-ID: <m%d@notifier.test>\r\nSubject: Order received\r\n\r\nThank you.\r\n", n)
	}
	// newMailer returns a mailer for srv that trusts srv's CA, closed when
	// the test ends.
	newMailer := func(t *testing.T, srv *smtptest.Server, mode TLSMode) *SMTPMailer {
		m := &SMTPMailer{Addr: srv.Addr, HeloName: "notifier.test", Timeout: 5 * time.Second, TLS: mode}
		if srv.CAPEM != nil {
			m.TLSConfig = &tls.Config{RootCAs: srv.RootCAs()}
		}
		t.Cleanup(func() { _ = m.Close() })
		return m
	}
	send := func(m *SMTPMailer) error {
		_, err := m.Send(context.Background(), from, to, message())
		return err
	}
	cached := func(m *SMTPMailer) bool {
		m.mu.Lock()
		defer m.mu.Unlock()
		return len(m.idle) > 0
	}

	t.Run("StartTLS", func(t *testing.T) {
		t.Parallel()
		srv := smtptest.StartWith(t, smtptest.Options{TLS: smtptest.StartTLS})
		require.NoError(t, send(newMailer(t, srv, TLSStartTLS)))
		got := srv.Accepted()
		require.Len(t, got, 1)
		require.True(t, got[0].TLS, "the message went over TLS")
	})

	t.Run("ImplicitTLS", func(t *testing.T) {
		t.Parallel()
		srv := smtptest.StartWith(t, smtptest.Options{TLS: smtptest.ImplicitTLS})
		require.NoError(t, send(newMailer(t, srv, TLSImplicit)))
		got := srv.Accepted()
		require.Len(t, got, 1)
		require.True(t, got[0].TLS)
	})

	t.Run("Auth", func(t *testing.T) {
		t.Parallel()
		for _, tc := range []struct {
			name    string
			tls     smtptest.TLSMode
			mode    TLSMode
			offered []string
			want    string
		}{
			{"PlainPreferred", smtptest.StartTLS, TLSStartTLS, []string{sasl.Login, sasl.Plain}, sasl.Plain},
			{"LoginWhenOnlyOffer", smtptest.StartTLS, TLSStartTLS, []string{sasl.Login}, sasl.Login},
			{"PlainOverImplicitTLS", smtptest.ImplicitTLS, TLSImplicit, nil, sasl.Plain},
			{"LoginOverImplicitTLS", smtptest.ImplicitTLS, TLSImplicit, []string{sasl.Login}, sasl.Login},
		} {
			t.Run(tc.name, func(t *testing.T) {
				t.Parallel()
				srv := smtptest.StartWith(t, smtptest.Options{TLS: tc.tls, Username: "notifier", Password: "s3cret", AuthMechanisms: tc.offered})
				m := newMailer(t, srv, tc.mode)
				m.Username, m.Password = "notifier", "s3cret"
				require.NoError(t, send(m))
				got := srv.Accepted()
				require.Len(t, got, 1)
				require.Equal(t, tc.want, got[0].AuthMechanism)
				require.True(t, got[0].TLS)
			})
		}
	})

	t.Run("WrongPasswordIsPermanent", func(t *testing.T) {
		t.Parallel()
		srv := smtptest.StartWith(t, smtptest.Options{TLS: smtptest.StartTLS, Username: "notifier", Password: "s3cret"})
		m := newMailer(t, srv, TLSStartTLS)
		m.Username, m.Password = "notifier", "wrong"
		err := send(m)
		require.ErrorIs(t, err, ErrPermanent, "the same credentials would fail again")
		require.Contains(t, err.Error(), "535")
		require.Equal(t, 1, srv.AuthAttempts())
		require.Empty(t, srv.Received())
	})

	t.Run("StartTLSNotOffered", func(t *testing.T) {
		t.Parallel()
		srv := smtptest.Start(t)
		err := send(newMailer(t, srv, TLSStartTLS))
		require.ErrorIs(t, err, ErrPermanent)
		require.Contains(t, err.Error(), "does not offer it")
		require.Empty(t, srv.Received(), "no fallback to plain text")
	})

	t.Run("AuthRefusedWithoutTLS", func(t *testing.T) {
		t.Parallel()
		// The server offers AUTH on its plain connection.
		srv := smtptest.StartWith(t, smtptest.Options{Username: "notifier", Password: "s3cret"})
		m := newMailer(t, srv, TLSNone)
		m.Username, m.Password = "notifier", "s3cret"
		err := send(m)
		require.ErrorIs(t, err, ErrPermanent)
		require.Contains(t, err.Error(), "unencrypted")
		require.NotContains(t, err.Error(), "s3cret")
		require.Zero(t, srv.AuthAttempts(), "no credentials sent in clear")
		require.Empty(t, srv.Received())
	})

	t.Run("Certificate", func(t *testing.T) {
		t.Parallel()
		for _, tc := range []struct {
			name   string
			config func(srv *smtptest.Server) *tls.Config
			ok     bool
		}{
			{"UntrustedCA", func(*smtptest.Server) *tls.Config { return nil }, false},
			{"WrongServerName", func(srv *smtptest.Server) *tls.Config {
				return &tls.Config{RootCAs: srv.RootCAs(), ServerName: "smtp.example.com"}
			}, false},
			{"ServerNameOverride", func(srv *smtptest.Server) *tls.Config {
				return &tls.Config{RootCAs: srv.RootCAs(), ServerName: "localhost"}
			}, true},
		} {
			t.Run(tc.name, func(t *testing.T) {
				t.Parallel()
				srv := smtptest.StartWith(t, smtptest.Options{TLS: smtptest.StartTLS})
				m := newMailer(t, srv, TLSStartTLS)
				m.TLSConfig = tc.config(srv)
				err := send(m)
				if tc.ok {
					require.NoError(t, err)
					return
				}
				require.ErrorIs(t, err, ErrPermanent, "a certificate that does not verify is configuration, not bad luck")
				require.Empty(t, srv.Received())
			})
		}
	})

	t.Run("ReusesConnection", func(t *testing.T) {
		t.Parallel()
		srv := smtptest.StartWith(t, smtptest.Options{TLS: smtptest.StartTLS, Username: "notifier", Password: "s3cret"})
		m := newMailer(t, srv, TLSStartTLS)
		m.Username, m.Password = "notifier", "s3cret"
		for range 3 {
			require.NoError(t, send(m))
		}
		require.Len(t, srv.Accepted(), 3)
		require.Equal(t, 1, srv.Connections())
		require.Equal(t, 1, srv.AuthAttempts(), "authenticated once")
	})

	t.Run("ReconnectsAfterServerClose", func(t *testing.T) {
		t.Parallel()
		srv := smtptest.StartWith(t, smtptest.Options{TLS: smtptest.ImplicitTLS, Username: "notifier", Password: "s3cret"})
		m := newMailer(t, srv, TLSImplicit)
		m.Username, m.Password = "notifier", "s3cret"
		require.NoError(t, send(m))
		srv.CloseConnections() // the relay's idle timeout
		require.NoError(t, send(m), "a dead cached connection is replaced within the same send")
		require.Len(t, srv.Received(), 2, "each message handed over once")
		require.Equal(t, 2, srv.Connections())
	})

	t.Run("DiscardsConnectionAfterError", func(t *testing.T) {
		t.Parallel()
		srv := smtptest.Start(t)
		srv.SetBehaviour(func(n int, _ smtptest.Message) smtptest.Action {
			if n == 2 {
				return smtptest.TempFail
			}
			return smtptest.Accept
		})
		m := newMailer(t, srv, TLSNone)
		require.NoError(t, send(m))
		require.ErrorIs(t, send(m), ErrTransient)
		require.False(t, cached(m))
		require.NoError(t, send(m))
		require.Equal(t, 2, srv.Connections(), "the connection of the failed send was not reused")
	})

	t.Run("DropAfterDataOverTLS", func(t *testing.T) {
		t.Parallel()
		srv := smtptest.StartWith(t, smtptest.Options{TLS: smtptest.StartTLS})
		srv.SetBehaviour(func(int, smtptest.Message) smtptest.Action { return smtptest.Drop })
		err := send(newMailer(t, srv, TLSStartTLS))
		require.ErrorIs(t, err, ErrUnknownOutcome)
		require.Len(t, srv.Received(), 1, "the whole message arrived")
	})

	t.Run("StalledGreeting", func(t *testing.T) {
		t.Parallel()
		for _, tc := range []struct {
			name string
			tls  smtptest.TLSMode
			mode TLSMode
		}{
			{"Plain", smtptest.NoTLS, TLSNone},
			{"StartTLS", smtptest.StartTLS, TLSStartTLS},
			{"ImplicitTLS", smtptest.ImplicitTLS, TLSImplicit},
		} {
			t.Run(tc.name, func(t *testing.T) {
				t.Parallel()
				srv := smtptest.StartWith(t, smtptest.Options{TLS: tc.tls, StallGreeting: true})
				m := newMailer(t, srv, tc.mode)
				m.Timeout = 300 * time.Millisecond
				done := make(chan error, 1)
				go func() { done <- send(m) }()
				select {
				case err := <-done:
					require.ErrorIs(t, err, ErrTransient)
				case <-time.After(20 * time.Second):
					t.Fatal("Send did not return although the greeting never came")
				}
				require.Equal(t, 1, srv.Connections(), "TCP was accepted; only the greeting was missing")
			})
		}
	})

	t.Run("IdleConnectionClosed", func(t *testing.T) {
		t.Parallel()
		srv := smtptest.Start(t)
		m := newMailer(t, srv, TLSNone)
		m.IdleTimeout = 50 * time.Millisecond
		require.NoError(t, send(m))
		require.Eventually(t, func() bool { return !cached(m) }, 10*time.Second, 10*time.Millisecond)
		require.NoError(t, send(m))
		require.Equal(t, 2, srv.Connections())
	})

	t.Run("Close", func(t *testing.T) {
		t.Parallel()
		srv := smtptest.Start(t)
		m := newMailer(t, srv, TLSNone)
		require.NoError(t, send(m))
		require.True(t, cached(m))
		require.NoError(t, m.Close())
		require.False(t, cached(m))
		require.NoError(t, send(m), "a send after Close still works")
		require.False(t, cached(m), "and keeps no connection")
		require.Equal(t, 2, srv.Connections())
	})

	t.Run("Concurrent", func(t *testing.T) {
		t.Parallel()
		srv := smtptest.StartWith(t, smtptest.Options{TLS: smtptest.StartTLS})
		m := newMailer(t, srv, TLSStartTLS)
		const senders = 8
		errs := make(chan error, senders)
		for range senders {
			go func() { errs <- send(m) }()
		}
		for range senders {
			require.NoError(t, <-errs)
		}
		require.Len(t, srv.Accepted(), senders)
		require.LessOrEqual(t, srv.Connections(), senders)
	})
}
