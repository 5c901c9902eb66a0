// Package smtptest runs an in-process SMTP server for tests that can fail
// on demand: accept a message, answer 4xx or 5xx after DATA, or drop the
// connection after the whole message arrived without answering (the
// "unknown outcome" of a send).
package smtptest

import (
	"bytes"
	"context"
	"errors"
	"io"
	"net"
	"net/mail"
	"sync"
	"testing"
	"time"

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
}

// Server is a test SMTP server.
type Server struct {
	// Addr is host:port to give the client.
	Addr string

	mu       sync.Mutex
	decide   func(n int, m Message) Action
	received []Message
}

// Start starts a server on a free loopback port; it stops when the test
// ends. Every message is accepted until SetBehaviour says otherwise.
func Start(t testing.TB) *Server {
	t.Helper()
	var lc net.ListenConfig
	l, err := lc.Listen(context.Background(), "tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatalf("smtptest: listen: %v", err)
	}
	s := &Server{Addr: l.Addr().String()}
	srv := smtp.NewServer(smtp.BackendFunc(func(c *smtp.Conn) (smtp.Session, error) {
		return &session{s: s, conn: c}, nil
	}))
	srv.Domain = "smtptest.local"
	srv.ReadTimeout, srv.WriteTimeout = 10*time.Second, 10*time.Second
	srv.AllowInsecureAuth = true
	go func() { _ = srv.Serve(l) }()
	t.Cleanup(func() { _ = srv.Close() })
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

type session struct {
	s    *Server
	conn *smtp.Conn
	from string
	to   []string
}

func (ss *session) Reset()        { ss.from, ss.to = "", nil }
func (ss *session) Logout() error { return nil }
func (ss *session) Mail(from string, _ *smtp.MailOptions) error {
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
	m := Message{From: ss.from, To: ss.to, Raw: raw}
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
	}
	return nil
}
