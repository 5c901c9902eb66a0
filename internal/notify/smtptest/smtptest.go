// Package smtptest runs an in-process SMTP server for tests that can fail
// on demand: accept a message, answer 4xx or 5xx after DATA, or drop the
// connection after the whole message arrived without answering (the
// "unknown outcome" of a send).
//
// StartWith adds what a real provider does to the connection: STARTTLS or
// implicit TLS with a private CA made for the test, required AUTH (PLAIN
// and LOGIN), closing connections from the server side, and a greeting
// that never comes.
package smtptest

import (
	"bytes"
	"context"
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/rand"
	"crypto/tls"
	"crypto/x509"
	"crypto/x509/pkix"
	"encoding/pem"
	"errors"
	"io"
	"math/big"
	"net"
	"net/mail"
	"os"
	"path/filepath"
	"slices"
	"sync"
	"testing"
	"time"

	"github.com/emersion/go-sasl"
	"github.com/emersion/go-smtp"
)

// Action is what the server does with one received message.
type Action int

const (
	// Accept answers 250: the message is delivered.
	Accept Action = iota
	// Drop closes the connection after reading the whole message and
	// before answering, so the client cannot know whether it was accepted.
	Drop
	// TempFail answers 451 (transient).
	TempFail
	// PermFail answers 554 (permanent).
	PermFail
	// Hang reads the whole message and never answers, until the client
	// goes away or the test ends: the moment a sender dies in the middle
	// of a send whose outcome it will never learn.
	Hang
)

// Message is one message the server received.
type Message struct {
	From      string
	To        []string
	MessageID string
	Subject   string
	Raw       []byte
	// Action is what the server did with it.
	Action Action
	// TLS reports whether the message arrived over TLS (implicit or after
	// STARTTLS).
	TLS bool
	// AuthMechanism is the SASL mechanism the session authenticated with,
	// or "" when it did not authenticate.
	AuthMechanism string
}

// TLSMode is how the server offers TLS.
type TLSMode int

const (
	// NoTLS serves plain SMTP and does not offer STARTTLS.
	NoTLS TLSMode = iota
	// StartTLS serves plain SMTP and offers STARTTLS.
	StartTLS
	// ImplicitTLS expects a TLS handshake before the greeting, as on
	// port 465.
	ImplicitTLS
)

// Options configure a server started with StartWith. The zero value is
// the server Start returns.
type Options struct {
	// TLS is how TLS is offered. With StartTLS or ImplicitTLS the server
	// presents a certificate for 127.0.0.1 and localhost signed by a CA
	// generated for this server (Server.CAPEM).
	TLS TLSMode
	// Username and Password, when set, make AUTH required before MAIL.
	// The server offers AUTH on plain connections too, as a careless relay
	// would, so that a test can prove the client refuses to use it there.
	Username, Password string
	// AuthMechanisms are the SASL mechanisms offered when AUTH is
	// required: PLAIN and LOGIN unless set.
	AuthMechanisms []string
	// StallGreeting accepts TCP connections but hands none of them to the
	// SMTP server, so no greeting (or TLS handshake) is ever sent, until
	// ReleaseGreeting is called or the test ends.
	StallGreeting bool
}

// Server is a test SMTP server.
type Server struct {
	// Addr is host:port to give the client.
	Addr string
	// CAPEM is the PEM certificate of the CA that signed the server's
	// certificate, or nil without TLS.
	CAPEM []byte

	opts    Options
	release chan struct{} // closed by ReleaseGreeting
	done    chan struct{} // closed when the test ends
	relOnce sync.Once

	mu           sync.Mutex
	decide       func(n int, m Message) Action
	received     []Message
	accepted     int                   // TCP connections accepted
	open         map[net.Conn]struct{} // TCP connections not yet closed
	authAttempts int
}

// Start starts a server on a free loopback port; it stops when the test
// ends. Every message is accepted until SetBehaviour says otherwise.
func Start(t testing.TB) *Server {
	t.Helper()
	return StartWith(t, Options{})
}

// StartWith starts a server configured by opts on a free loopback port; it
// stops when the test ends.
func StartWith(t testing.TB, opts Options) *Server {
	t.Helper()
	if opts.Username != "" && len(opts.AuthMechanisms) == 0 {
		opts.AuthMechanisms = []string{sasl.Plain, sasl.Login}
	}
	var lc net.ListenConfig
	tcp, err := lc.Listen(context.Background(), "tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatalf("smtptest: listen: %v", err)
	}
	s := &Server{Addr: tcp.Addr().String(), opts: opts, release: make(chan struct{}), done: make(chan struct{}),
		open: map[net.Conn]struct{}{}}
	var l net.Listener = &listener{Listener: tcp, s: s}

	srv := smtp.NewServer(smtp.BackendFunc(func(c *smtp.Conn) (smtp.Session, error) {
		return &session{s: s, conn: c}, nil
	}))
	srv.Domain = "smtptest.local"
	srv.ReadTimeout, srv.WriteTimeout = 10*time.Second, 10*time.Second
	srv.AllowInsecureAuth = true
	if opts.TLS != NoTLS {
		caPEM, cert, err := newCertificate()
		if err != nil {
			t.Fatalf("smtptest: %v", err)
		}
		s.CAPEM = caPEM
		tc := &tls.Config{Certificates: []tls.Certificate{cert}, MinVersion: tls.VersionTLS12}
		if opts.TLS == StartTLS {
			srv.TLSConfig = tc // go-smtp offers STARTTLS when it has a TLS config
		} else {
			l = tls.NewListener(l, tc)
		}
	}
	go func() { _ = srv.Serve(l) }()
	t.Cleanup(func() {
		close(s.done) // before Close: a stalled Accept would keep the listener busy
		_ = srv.Close()
	})
	return s
}

// SetBehaviour decides the action for each message: n counts received
// messages from 1.
func (s *Server) SetBehaviour(fn func(n int, m Message) Action) {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.decide = fn
}

// Received returns every message whose DATA arrived, whatever the action.
func (s *Server) Received() []Message {
	s.mu.Lock()
	defer s.mu.Unlock()
	return append([]Message(nil), s.received...)
}

// Accepted returns the messages answered with 250.
func (s *Server) Accepted() []Message {
	var out []Message
	for _, m := range s.Received() {
		if m.Action == Accept {
			out = append(out, m)
		}
	}
	return out
}

// Count returns how many received messages carry the Message-ID.
func (s *Server) Count(messageID string) int {
	n := 0
	for _, m := range s.Received() {
		if m.MessageID == messageID {
			n++
		}
	}
	return n
}

// Connections returns how many TCP connections the server has accepted,
// so a test can tell a reused connection from a new one.
func (s *Server) Connections() int {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.accepted
}

// AuthAttempts returns how many AUTH commands reached a mechanism, whether
// they succeeded or not.
func (s *Server) AuthAttempts() int {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.authAttempts
}

// CloseConnections closes every open client connection from the server
// side without a word, as a server does when its idle timeout expires or
// it restarts.
func (s *Server) CloseConnections() {
	s.mu.Lock()
	conns := make([]net.Conn, 0, len(s.open))
	for c := range s.open {
		conns = append(conns, c)
	}
	s.mu.Unlock()
	for _, c := range conns {
		_ = c.Close()
	}
}

// ReleaseGreeting lets connections held by Options.StallGreeting proceed.
func (s *Server) ReleaseGreeting() {
	s.relOnce.Do(func() { close(s.release) })
}

// RootCAs returns a pool holding the server's CA, for a client's
// tls.Config.
func (s *Server) RootCAs() *x509.CertPool {
	pool := x509.NewCertPool()
	pool.AppendCertsFromPEM(s.CAPEM)
	return pool
}

// WriteCAFile writes the server's CA to a PEM file in a temporary
// directory of the test and returns its path.
func (s *Server) WriteCAFile(t testing.TB) string {
	t.Helper()
	path := filepath.Join(t.TempDir(), "smtptest-ca.pem")
	if err := os.WriteFile(path, s.CAPEM, 0o600); err != nil {
		t.Fatalf("smtptest: write CA file: %v", err)
	}
	return path
}

// listener counts and tracks the TCP connections below go-smtp (and below
// TLS with ImplicitTLS), and holds them back when the greeting stalls.
type listener struct {
	net.Listener
	s *Server
}

func (l *listener) Accept() (net.Conn, error) {
	c, err := l.Listener.Accept()
	if err != nil {
		return nil, err
	}
	s := l.s
	tc := &trackedConn{Conn: c, s: s}
	s.mu.Lock()
	s.accepted++
	s.open[tc] = struct{}{}
	s.mu.Unlock()
	if s.opts.StallGreeting {
		select {
		case <-s.release:
		case <-s.done:
			_ = tc.Close()
			return nil, net.ErrClosed
		}
	}
	return tc, nil
}

type trackedConn struct {
	net.Conn
	s *Server
}

func (c *trackedConn) Close() error {
	c.s.mu.Lock()
	delete(c.s.open, c)
	c.s.mu.Unlock()
	return c.Conn.Close()
}

// newCertificate makes a private CA and a server certificate it signs for
// 127.0.0.1 and localhost. ECDSA P-256 keeps generation fast enough to do
// per test.
func newCertificate() (caPEM []byte, cert tls.Certificate, err error) {
	caKey, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		return nil, tls.Certificate{}, err
	}
	now := time.Now()
	caTmpl := &x509.Certificate{
		SerialNumber:          big.NewInt(1),
		Subject:               pkix.Name{CommonName: "smtptest CA"},
		NotBefore:             now.Add(-time.Hour),
		NotAfter:              now.Add(24 * time.Hour),
		KeyUsage:              x509.KeyUsageCertSign,
		BasicConstraintsValid: true,
		IsCA:                  true,
	}
	caDER, err := x509.CreateCertificate(rand.Reader, caTmpl, caTmpl, &caKey.PublicKey, caKey)
	if err != nil {
		return nil, tls.Certificate{}, err
	}
	ca, err := x509.ParseCertificate(caDER)
	if err != nil {
		return nil, tls.Certificate{}, err
	}

	key, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		return nil, tls.Certificate{}, err
	}
	tmpl := &x509.Certificate{
		SerialNumber: big.NewInt(2),
		Subject:      pkix.Name{CommonName: "localhost"},
		NotBefore:    now.Add(-time.Hour),
		NotAfter:     now.Add(24 * time.Hour),
		KeyUsage:     x509.KeyUsageDigitalSignature,
		ExtKeyUsage:  []x509.ExtKeyUsage{x509.ExtKeyUsageServerAuth},
		DNSNames:     []string{"localhost"},
		IPAddresses:  []net.IP{net.IPv4(127, 0, 0, 1)},
	}
	der, err := x509.CreateCertificate(rand.Reader, tmpl, ca, &key.PublicKey, caKey)
	if err != nil {
		return nil, tls.Certificate{}, err
	}
	caPEM = pem.EncodeToMemory(&pem.Block{Type: "CERTIFICATE", Bytes: caDER})
	return caPEM, tls.Certificate{Certificate: [][]byte{der}, PrivateKey: key}, nil
}

type session struct {
	s        *Server
	conn     *smtp.Conn
	from     string
	to       []string
	authMech string // survives Reset: RSET and EHLO do not undo AUTH
}

// errAuthFailed is the reply to wrong credentials. A plain error would be
// answered 454 (temporary), which is not what providers say.
var errAuthFailed = &smtp.SMTPError{Code: 535, EnhancedCode: smtp.EnhancedCode{5, 7, 8}, Message: "authentication credentials invalid"}

func (ss *session) Reset()        { ss.from, ss.to = "", nil }
func (ss *session) Logout() error { return nil }

func (ss *session) AuthMechanisms() []string { return ss.s.opts.AuthMechanisms }

func (ss *session) Auth(mech string) (sasl.Server, error) {
	s := ss.s
	s.mu.Lock()
	s.authAttempts++
	s.mu.Unlock()
	if !slices.Contains(s.opts.AuthMechanisms, mech) {
		return nil, smtp.ErrAuthUnknownMechanism
	}
	check := func(identity, username, password string) error {
		if (identity != "" && identity != username) || username != s.opts.Username || password != s.opts.Password {
			return errAuthFailed
		}
		ss.authMech = mech
		return nil
	}
	if mech == sasl.Login {
		return &loginServer{check: check}, nil
	}
	return sasl.NewPlainServer(check), nil
}

func (ss *session) Mail(from string, _ *smtp.MailOptions) error {
	if ss.s.opts.Username != "" && ss.authMech == "" {
		return &smtp.SMTPError{Code: 530, EnhancedCode: smtp.EnhancedCode{5, 7, 0}, Message: "authentication required"}
	}
	ss.from = from
	return nil
}

func (ss *session) Rcpt(to string, _ *smtp.RcptOptions) error {
	ss.to = append(ss.to, to)
	return nil
}

func (ss *session) Data(r io.Reader) error {
	raw, err := io.ReadAll(r)
	if err != nil {
		return err
	}
	_, isTLS := ss.conn.TLSConnectionState()
	m := Message{From: ss.from, To: ss.to, Raw: raw, TLS: isTLS, AuthMechanism: ss.authMech}
	if pm, err := mail.ReadMessage(bytes.NewReader(raw)); err == nil {
		m.MessageID = pm.Header.Get("Message-ID")
		m.Subject = pm.Header.Get("Subject")
	}
	s := ss.s
	s.mu.Lock()
	m.Action = Accept
	if s.decide != nil {
		m.Action = s.decide(len(s.received)+1, m)
	}
	s.received = append(s.received, m)
	s.mu.Unlock()

	switch m.Action {
	case Drop:
		_ = ss.conn.Conn().Close()
		return errors.New("connection dropped")
	case TempFail:
		return &smtp.SMTPError{Code: 451, EnhancedCode: smtp.EnhancedCode{4, 3, 0}, Message: "try again later"}
	case PermFail:
		return &smtp.SMTPError{Code: 554, EnhancedCode: smtp.EnhancedCode{5, 7, 1}, Message: "rejected"}
	case Hang:
		<-s.done
		return errors.New("server stopped")
	}
	return nil
}

// loginServer is the server side of the LOGIN mechanism, which go-sasl
// provides only as a client. The client may send the username as the
// initial response (go-sasl does), or wait for the "Username:" challenge.
type loginServer struct {
	check    func(identity, username, password string) error
	username string
	gotUser  bool
}

func (l *loginServer) Next(response []byte) (challenge []byte, done bool, err error) {
	switch {
	case !l.gotUser && response == nil:
		return []byte("Username:"), false, nil
	case !l.gotUser:
		l.username, l.gotUser = string(response), true
		return []byte("Password:"), false, nil
	default:
		return nil, true, l.check("", l.username, string(response))
	}
}
