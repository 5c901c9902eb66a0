// Command mailsink is a local SMTP sink for the demo: it accepts every
// message on an SMTP port, keeps the most recent ones in memory and lists
// them over HTTP. It delivers nothing anywhere.
//
//	MAILSINK_SMTP_ADDR  SMTP listen address (default 127.0.0.1:1025)
//	MAILSINK_HTTP_ADDR  HTTP listen address (default 127.0.0.1:8025)
//	MAILSINK_KEEP       messages kept in memory (default 1000)
//
// HTTP: GET / (an HTML list), GET /api/messages (JSON, oldest first),
// GET /messages/{n} (one raw message), DELETE /api/messages (clear).
package main

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"html/template"
	"io"
	"log/slog"
	"mime"
	"net"
	"net/http"
	"net/mail"
	"os"
	"os/signal"
	"strconv"
	"sync"
	"syscall"
	"time"

	"github.com/emersion/go-smtp"

	"github.com/outboxref/orders/internal/envconfig"
)

func main() {
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	defer stop()
	if err := run(ctx, os.Getenv, os.Stdout); err != nil {
		fmt.Fprintln(os.Stderr, "mailsink:", err)
		os.Exit(1)
	}
}

// Message is one received email.
type Message struct {
	N          int       `json:"n"`
	ReceivedAt time.Time `json:"received_at"`
	From       string    `json:"from"`
	To         []string  `json:"to"`
	MessageID  string    `json:"message_id"`
	Subject    string    `json:"subject"`
	Size       int       `json:"size"`
	raw        []byte
}

type store struct {
	mu   sync.Mutex
	keep int
	next int
	msgs []Message
}

func (s *store) add(m Message) Message {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.next++
	m.N = s.next
	s.msgs = append(s.msgs, m)
	if len(s.msgs) > s.keep {
		s.msgs = s.msgs[len(s.msgs)-s.keep:]
	}
	return m
}

func (s *store) list() []Message {
	s.mu.Lock()
	defer s.mu.Unlock()
	return append([]Message(nil), s.msgs...)
}

func (s *store) get(n int) (Message, bool) {
	s.mu.Lock()
	defer s.mu.Unlock()
	for _, m := range s.msgs {
		if m.N == n {
			return m, true
		}
	}
	return Message{}, false
}

func (s *store) clear() {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.msgs = nil
}

func run(ctx context.Context, getenv func(string) string, stdout io.Writer) error {
	r := envconfig.New(getenv)
	smtpAddr := r.String("MAILSINK_SMTP_ADDR", "127.0.0.1:1025")
	httpAddr := r.String("MAILSINK_HTTP_ADDR", "127.0.0.1:8025")
	keep := r.Int("MAILSINK_KEEP", 1000, 1, 1_000_000)
	if err := r.Err(); err != nil {
		return fmt.Errorf("invalid configuration:\n%w", err)
	}
	log := slog.New(slog.NewJSONHandler(stdout, nil))
	st := &store{keep: keep}

	ss := smtp.NewServer(smtp.BackendFunc(func(*smtp.Conn) (smtp.Session, error) { return &session{st: st, log: log}, nil }))
	ss.Domain = "mailsink.local"
	ss.ReadTimeout, ss.WriteTimeout = time.Minute, time.Minute
	ss.MaxMessageBytes = 10 << 20
	ss.AllowInsecureAuth = true
	var lc net.ListenConfig
	sl, err := lc.Listen(ctx, "tcp", smtpAddr)
	if err != nil {
		return fmt.Errorf("listen smtp: %w", err)
	}
	hs := &http.Server{Addr: httpAddr, Handler: handler(st), ReadHeaderTimeout: 5 * time.Second,
		ReadTimeout: 10 * time.Second, WriteTimeout: 10 * time.Second, IdleTimeout: time.Minute}
	hl, err := lc.Listen(ctx, "tcp", httpAddr)
	if err != nil {
		sl.Close()
		return fmt.Errorf("listen http: %w", err)
	}
	errs := make(chan error, 2)
	go func() { errs <- ss.Serve(sl) }()
	go func() { errs <- hs.Serve(hl) }()
	log.Info("mailsink started", "smtp_addr", sl.Addr().String(), "http_addr", "http://"+hl.Addr().String())

	var runErr error
	select {
	case <-ctx.Done():
	case runErr = <-errs:
	}
	sctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	_ = hs.Shutdown(sctx)
	_ = ss.Close()
	if errors.Is(runErr, http.ErrServerClosed) || errors.Is(runErr, smtp.ErrServerClosed) {
		runErr = nil
	}
	return runErr
}

type session struct {
	st   *store
	log  *slog.Logger
	from string
	to   []string
}

func (s *session) Reset()        { s.from, s.to = "", nil }
func (s *session) Logout() error { return nil }
func (s *session) Mail(from string, _ *smtp.MailOptions) error {
	s.from = from
	return nil
}

func (s *session) Rcpt(to string, _ *smtp.RcptOptions) error {
	s.to = append(s.to, to)
	return nil
}

func (s *session) Data(r io.Reader) error {
	raw, err := io.ReadAll(r)
	if err != nil {
		return err
	}
	m := Message{ReceivedAt: time.Now().UTC(), From: s.from, To: s.to, Size: len(raw), raw: raw}
	if pm, err := mail.ReadMessage(bytes.NewReader(raw)); err == nil {
		m.MessageID = pm.Header.Get("Message-ID")
		m.Subject = pm.Header.Get("Subject")
		if dec, err := new(mime.WordDecoder).DecodeHeader(m.Subject); err == nil {
			m.Subject = dec
		}
	}
	m = s.st.add(m)
	s.log.Info("message received", "n", m.N, "message_id", m.MessageID, "subject", m.Subject, "size", m.Size)
	return nil
}

var page = template.Must(template.New("page").Parse(`<!doctype html>
<html><head><meta charset="utf-8"><title>mailsink</title>
<meta http-equiv="refresh" content="3">
<style>body{font-family:sans-serif;margin:2em}table{border-collapse:collapse}td,th{padding:.3em .8em;border-bottom:1px solid #ddd;text-align:left}</style>
</head><body><h1>mailsink: {{len .}} message(s)</h1>
<table><tr><th>#</th><th>received</th><th>to</th><th>subject</th><th>Message-ID</th></tr>
{{range .}}<tr><td><a href="/messages/{{.N}}">{{.N}}</a></td><td>{{.ReceivedAt.Format "15:04:05"}}</td><td>{{range .To}}{{.}} {{end}}</td><td>{{.Subject}}</td><td><code>{{.MessageID}}</code></td></tr>
{{end}}</table></body></html>`))

func handler(st *store) http.Handler {
	mux := http.NewServeMux()
	mux.HandleFunc("GET /{$}", func(w http.ResponseWriter, _ *http.Request) {
		w.Header().Set("Content-Type", "text/html; charset=utf-8")
		_ = page.Execute(w, st.list())
	})
	mux.HandleFunc("GET /api/messages", func(w http.ResponseWriter, _ *http.Request) {
		w.Header().Set("Content-Type", "application/json")
		_ = json.NewEncoder(w).Encode(st.list())
	})
	mux.HandleFunc("DELETE /api/messages", func(w http.ResponseWriter, _ *http.Request) {
		st.clear()
		w.WriteHeader(http.StatusNoContent)
	})
	mux.HandleFunc("GET /messages/{n}", func(w http.ResponseWriter, r *http.Request) {
		n, err := strconv.Atoi(r.PathValue("n"))
		m, ok := st.get(n)
		if err != nil || !ok {
			http.NotFound(w, r)
			return
		}
		w.Header().Set("Content-Type", "text/plain; charset=utf-8")
		_, _ = w.Write(m.raw)
	})
	mux.HandleFunc("GET /healthz", func(w http.ResponseWriter, _ *http.Request) { _, _ = io.WriteString(w, "ok\n") })
	return mux
}
