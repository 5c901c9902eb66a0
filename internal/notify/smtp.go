package notify

import (
	"context"
	"crypto/tls"
	"errors"
	"fmt"
	"net"
	"slices"
	"sync"
	"time"

	"github.com/emersion/go-sasl"
	"github.com/emersion/go-smtp"
)

// The three ways a send can fail. They decide what the ledger does next.
var (
	// ErrTransient means the email was certainly not accepted and may be
	// sent again: a 4xx reply, or a connection lost before the message was
	// complete.
	ErrTransient = errors.New("transient send failure")
	// ErrPermanent means the server refused the email for good (5xx), or
	// the relay cannot be used as configured (failed AUTH, no STARTTLS, a
	// certificate that does not verify): sending again cannot help.
	ErrPermanent = errors.New("permanent send failure")
	// ErrUnknownOutcome means the whole message was handed over but the
	// answer was lost: the server may or may not have accepted it.
	ErrUnknownOutcome = errors.New("send outcome unknown")
)

// Mailer sends one message.
type Mailer interface {
	// Send delivers msg and returns the server's reply text. Errors wrap
	// ErrTransient, ErrPermanent or ErrUnknownOutcome.
	Send(ctx context.Context, from, to string, msg []byte) (reply string, err error)
}

// TLSMode is how SMTPMailer protects its connection to the relay.
type TLSMode string

const (
	// TLSNone speaks plain SMTP: for a relay on the same host or a local
	// demo sink. AUTH is refused on such a connection.
	TLSNone TLSMode = "none"
	// TLSStartTLS connects in clear and upgrades with STARTTLS, typically
	// on port 587. A relay that does not offer STARTTLS is refused, never
	// used in clear: anyone on the path can strip the offer.
	TLSStartTLS TLSMode = "starttls"
	// TLSImplicit speaks TLS from the first byte, typically on port 465.
	TLSImplicit TLSMode = "tls"
)

// DefaultIdleTimeout is how long SMTPMailer keeps an unused connection
// open when IdleTimeout is zero. It stays below the idle timeouts relays
// commonly apply, so that the mailer usually closes with a QUIT first.
const DefaultIdleTimeout = 30 * time.Second

// quitTimeout bounds the QUIT sent when an idle connection is closed: no
// send waits on it, and a relay that does not answer is simply left.
const quitTimeout = 5 * time.Second

// SMTPMailer sends through an SMTP relay, with TLS and AUTH as configured.
//
// It keeps established, authenticated connections between sends,
// because providers rate-limit new connections and each one costs a TLS
// handshake and AUTH. A cached connection that turns out dead (the relay's
// own idle timeout closed it) fails at MAIL FROM, before anything of the
// message went out, and the send is then retried once on a fresh
// connection. After any other error the connection is closed: it is never
// reused in an unknown state.
//
// SMTPMailer is safe for concurrent use. Its mutex guards the cached
// connections (up to MaxIdle, one per concurrent sender), never a send: a
// Send takes a connection out of the cache and puts it back when done, and
// a concurrent Send that finds the cache empty dials its own. Set the
// fields before the first Send and leave them alone afterwards.
type SMTPMailer struct {
	// Addr is host:port of the relay.
	Addr string
	// HeloName is the name given in EHLO.
	HeloName string
	// Timeout bounds one send, from dial (or reuse of the cached
	// connection) to the reply after DATA, the retry on a fresh connection
	// included.
	Timeout time.Duration
	// TLS is how the connection is protected; empty means TLSNone.
	TLS TLSMode
	// TLSConfig gives the roots to trust (RootCAs; nil means the system
	// roots) and the name to verify the certificate against (ServerName;
	// empty means the host of Addr). TLS 1.2 is the minimum whatever it
	// says. Nil means those defaults.
	TLSConfig *tls.Config
	// Username and Password, when either is set, authenticate with AUTH
	// PLAIN, or LOGIN when the relay does not offer PLAIN. Only ever over
	// TLS: on a plain connection Send fails with ErrPermanent before
	// anything of the credentials is sent.
	Username, Password string
	// IdleTimeout closes a cached connection when no send has used it for
	// this long; zero means DefaultIdleTimeout.
	IdleTimeout time.Duration
	// MaxIdle is how many connections are kept between sends: as many as
	// sends run at once (the Sender's Workers). Zero means one.
	MaxIdle int

	mu     sync.Mutex
	idle   []*idleConn // the cached connections, the most recently used last
	closed bool        // set by Close: no connection is cached any more
}

// idleConn is a cached connection and the timer that closes it when it
// stays unused for IdleTimeout.
type idleConn struct {
	sc    *smtpConn
	timer *time.Timer
}

// smtpConn is one established connection: greeted, TLS in place and
// authenticated.
type smtpConn struct {
	raw net.Conn // the TCP connection, below TLS
	c   *smtp.Client
}

// closeOnDone closes the connection when ctx ends. Closing the TCP
// connection unblocks whatever read, write or TLS handshake is in progress,
// so the deadline of ctx bounds every step. stop reports false when the
// connection was closed.
func (sc *smtpConn) closeOnDone(ctx context.Context) (stop func() bool) {
	return context.AfterFunc(ctx, func() { _ = sc.raw.Close() })
}

// discard closes the connection without a QUIT: after an error its state
// is unknown, and a polite close could wait on a relay that stopped
// reading.
func (sc *smtpConn) discard() { _ = sc.raw.Close() }

// Send implements Mailer.
func (m *SMTPMailer) Send(ctx context.Context, from, to string, msg []byte) (string, error) {
	ctx, cancel := context.WithTimeout(ctx, m.Timeout)
	defer cancel()

	if sc := m.takeIdle(); sc != nil {
		reply, gone, err := m.transact(ctx, sc, from, to, msg)
		if !gone {
			return m.finish(ctx, sc, reply, err)
		}
		// The cached connection was already closed when MAIL FROM went
		// out, so nothing of this message was handed over: sending it on a
		// fresh connection cannot deliver it twice. This is the one retry.
		// No RSET probes the connection first: go-smtp follows RSET with a
		// second EHLO, two round trips per message to learn what the
		// failure of MAIL FROM tells as surely.
		sc.discard()
	}
	sc, err := m.connect(ctx)
	if err != nil {
		return "", withCause(ctx, err)
	}
	reply, _, err := m.transact(ctx, sc, from, to, msg)
	return m.finish(ctx, sc, reply, err)
}

// finish caches the connection after a success and closes it after any
// error.
func (m *SMTPMailer) finish(ctx context.Context, sc *smtpConn, reply string, err error) (string, error) {
	if err != nil {
		sc.discard()
		return "", withCause(ctx, err)
	}
	// Once ctx has ended, closeOnDone may have closed the connection after
	// the reply came: only a connection certainly intact is kept.
	if ctx.Err() != nil {
		sc.discard()
	} else {
		m.putIdle(sc)
	}
	return reply, nil
}

// connect dials the relay and returns a connection ready for MAIL FROM:
// greeted, TLS in place as configured, authenticated when credentials are
// set.
func (m *SMTPMailer) connect(ctx context.Context) (*smtpConn, error) {
	var d net.Dialer
	raw, err := d.DialContext(ctx, "tcp", m.Addr)
	if err != nil {
		return nil, fmt.Errorf("%w: connect to %s: %v", ErrTransient, m.Addr, err)
	}
	sc := &smtpConn{raw: raw}
	stop := sc.closeOnDone(ctx)
	defer stop()
	if err := m.establish(ctx, sc); err != nil {
		sc.discard()
		return nil, err
	}
	return sc, nil
}

// noStartTLS is how go-smtp v0.25.1 reports a relay that does not offer
// STARTTLS: a bare error, with no sentinel or type to test. The
// StartTLSNotOffered test pins it; if the text changes, the refusal still
// holds and is only classified transient.
const noStartTLS = "smtp: server doesn't support STARTTLS"

func (m *SMTPMailer) establish(ctx context.Context, sc *smtpConn) error {
	switch m.TLS {
	case TLSImplicit:
		tc := tls.Client(sc.raw, m.tlsConfig())
		if err := tc.HandshakeContext(ctx); err != nil {
			return setupFailure("TLS handshake", err)
		}
		sc.c = smtp.NewClient(tc)
	case TLSStartTLS:
		// go-smtp greets, sends EHLO (as "localhost": the configured name
		// follows on the encrypted connection, the one that counts) and
		// STARTTLS, and fails rather than continue in clear. It waits for
		// these replies with its default timeout of minutes, so here
		// closeOnDone is what bounds them.
		c, err := smtp.NewClientStartTLS(sc.raw, m.tlsConfig())
		if err != nil {
			if err.Error() == noStartTLS {
				return fmt.Errorf("%w: STARTTLS: %s does not offer it; refusing to send in clear", ErrPermanent, m.Addr)
			}
			return setupFailure("STARTTLS", err)
		}
		sc.c = c
	case TLSNone, "":
		sc.c = smtp.NewClient(sc.raw)
	default:
		return fmt.Errorf("%w: unknown TLS mode %q", ErrPermanent, m.TLS)
	}
	sc.c.CommandTimeout, sc.c.SubmissionTimeout = m.Timeout, m.Timeout
	helo := m.HeloName
	if helo == "" {
		helo = "localhost"
	}
	// After STARTTLS this is also where the handshake happens.
	if err := sc.c.Hello(helo); err != nil {
		return setupFailure("EHLO", err)
	}
	return m.auth(sc.c)
}

// tlsConfig completes TLSConfig: TLS 1.2 at least, and the host of Addr as
// the name to verify unless one is given.
func (m *SMTPMailer) tlsConfig() *tls.Config {
	tc := &tls.Config{MinVersion: tls.VersionTLS12}
	if m.TLSConfig != nil {
		tc = m.TLSConfig.Clone()
		tc.MinVersion = max(tc.MinVersion, tls.VersionTLS12)
	}
	if tc.ServerName == "" {
		tc.ServerName, _, _ = net.SplitHostPort(m.Addr)
	}
	return tc
}

// auth authenticates when credentials are set.
func (m *SMTPMailer) auth(c *smtp.Client) error {
	if m.Username == "" && m.Password == "" {
		return nil
	}
	// Configuration already refuses credentials without TLS. This checks
	// the connection actually in hand, so that no setting and no relay
	// offering AUTH in clear can make the credentials leave unencrypted.
	if _, ok := c.TLSConnectionState(); !ok {
		return fmt.Errorf("%w: AUTH: refused on the unencrypted connection to %s; credentials are only sent over TLS", ErrPermanent, m.Addr)
	}
	var a sasl.Client
	switch {
	case c.SupportsAuth(sasl.Plain):
		a = sasl.NewPlainClient("", m.Username, m.Password)
	case c.SupportsAuth(sasl.Login):
		// LOGIN is obsolete but some relays offer nothing else. Over TLS it
		// exposes no more than PLAIN.
		a = sasl.NewLoginClient(m.Username, m.Password)
	default:
		return fmt.Errorf("%w: AUTH: %s offers neither PLAIN nor LOGIN", ErrPermanent, m.Addr)
	}
	if err := c.Auth(a); err != nil {
		if errors.Is(err, sasl.ErrUnexpectedServerChallenge) {
			return fmt.Errorf("%w: AUTH: %v", ErrPermanent, err)
		}
		// A 535 (bad credentials) is a 5xx and so permanent: the same
		// credentials will fail again. A 454 (temporary) is retried.
		return beforeData("AUTH", err)
	}
	return nil
}

// transact sends one message on an established connection. gone reports
// that the connection was closed before MAIL FROM, its first command: an
// I/O error or a 421, the reply a relay sends as it closes an idle
// connection. Nothing of the message went out then.
func (m *SMTPMailer) transact(ctx context.Context, sc *smtpConn, from, to string, msg []byte) (reply string, gone bool, err error) {
	stop := sc.closeOnDone(ctx)
	defer stop()
	c := sc.c
	if err := c.Mail(from, nil); err != nil {
		var se *smtp.SMTPError
		gone = !errors.As(err, &se) || se.Code == 421
		return "", gone, beforeData("MAIL FROM", err)
	}
	if err := c.Rcpt(to, nil); err != nil {
		return "", false, beforeData("RCPT TO", err)
	}
	w, err := c.Data()
	if err != nil {
		return "", false, beforeData("DATA", err)
	}
	if _, err := w.Write(msg); err != nil {
		// The terminating dot has not been sent, so the server cannot
		// have accepted a message: safe to retry.
		return "", false, fmt.Errorf("%w: write message: %v", ErrTransient, err)
	}
	resp, err := w.CloseWithResponse()
	if err != nil {
		var se *smtp.SMTPError
		if errors.As(err, &se) {
			return "", false, classifyReply("end of DATA", se)
		}
		// The message and its terminating dot went out, and no reply came
		// back. The server may have queued it: only the ledger's policy may
		// decide to send it again.
		return "", false, fmt.Errorf("%w: no reply after the message was sent: %v", ErrUnknownOutcome, err)
	}
	return resp.StatusText, false, nil
}

// takeIdle takes the most recently used cached connection out of the
// cache, or returns nil.
func (m *SMTPMailer) takeIdle() *smtpConn {
	m.mu.Lock()
	defer m.mu.Unlock()
	if len(m.idle) == 0 {
		return nil
	}
	ic := m.idle[len(m.idle)-1]
	m.idle = m.idle[:len(m.idle)-1]
	ic.timer.Stop()
	return ic.sc
}

// putIdle caches a connection after a successful send, and arms its idle
// timer. When the cache is full, or after Close, it closes this one
// instead.
func (m *SMTPMailer) putIdle(sc *smtpConn) {
	m.mu.Lock()
	if m.closed || len(m.idle) >= max(m.MaxIdle, 1) {
		m.mu.Unlock()
		m.quit(sc)
		return
	}
	idle := m.IdleTimeout
	if idle <= 0 {
		idle = DefaultIdleTimeout
	}
	ic := &idleConn{sc: sc}
	ic.timer = time.AfterFunc(idle, func() { m.expire(ic) })
	m.idle = append(m.idle, ic)
	m.mu.Unlock()
}

// expire closes a cached connection if it is still in the cache. A timer
// that fired while its connection was taken finds it gone and does
// nothing; a connection put back gets a new entry and a new timer.
func (m *SMTPMailer) expire(ic *idleConn) {
	m.mu.Lock()
	i := slices.Index(m.idle, ic)
	if i < 0 {
		m.mu.Unlock()
		return
	}
	m.idle = slices.Delete(m.idle, i, i+1)
	m.mu.Unlock()
	m.quit(ic.sc)
}

// quit ends a connection that no send is using, politely.
func (m *SMTPMailer) quit(sc *smtpConn) {
	sc.c.CommandTimeout = min(quitTimeout, m.Timeout)
	_ = sc.c.Quit()
	_ = sc.c.Close()
}

// Close closes the cached connections, and makes later sends close their
// connection when done instead of caching it. It never fails; the error
// result makes SMTPMailer an io.Closer.
func (m *SMTPMailer) Close() error {
	m.mu.Lock()
	m.closed = true
	m.mu.Unlock()
	for sc := m.takeIdle(); sc != nil; sc = m.takeIdle() {
		m.quit(sc)
	}
	return nil
}

func beforeData(step string, err error) error {
	var se *smtp.SMTPError
	if errors.As(err, &se) {
		return classifyReply(step, se)
	}
	return fmt.Errorf("%w: %s: %v", ErrTransient, step, err)
}

// setupFailure classifies a failure while the connection is being set up.
// A certificate that does not verify against the configured roots and
// server name is a configuration problem (or an attack) that retrying
// cannot fix.
func setupFailure(step string, err error) error {
	var cve *tls.CertificateVerificationError
	if errors.As(err, &cve) {
		return fmt.Errorf("%w: %s: %v", ErrPermanent, step, err)
	}
	return beforeData(step, err)
}

func classifyReply(step string, se *smtp.SMTPError) error {
	if se.Code >= 500 {
		return fmt.Errorf("%w: %s: %d %s", ErrPermanent, step, se.Code, se.Message)
	}
	return fmt.Errorf("%w: %s: %d %s", ErrTransient, step, se.Code, se.Message)
}

// withCause names why ctx ended: a step cut short by closeOnDone reports
// only a closed connection.
func withCause(ctx context.Context, err error) error {
	if ctx.Err() == nil {
		return err
	}
	return fmt.Errorf("%w (%v)", err, context.Cause(ctx))
}
