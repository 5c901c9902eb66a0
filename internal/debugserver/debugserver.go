// Package debugserver serves the Go runtime's profiles (net/http/pprof) on
// a listener of their own, never on a service's public port.
//
// Profiles are for operators: a heap profile shows what the process holds,
// a CPU profile or an execution trace costs the service while it runs, and
// none of it is authenticated. So a service serves them only when
// DEBUG_ADDR names a listener, which an operator binds to loopback or to an
// interface the public cannot reach, and the handlers live on a private
// mux that nothing else serves.
//
// Importing net/http/pprof also registers its handlers on
// http.DefaultServeMux, as a side effect of the import that cannot be
// switched off. That mux is therefore never served: every server of this
// module has a handler of its own (a nil Handler would mean
// DefaultServeMux, and the public port would serve profiles).
package debugserver

import (
	"errors"
	"fmt"
	"log/slog"
	"net"
	"net/http"
	"net/http/pprof"
	"time"
)

// WriteTimeout bounds one response of the debug listener. A CPU profile
// or an execution trace takes as long as the seconds it is asked for
// (30 by default), so they may ask for up to about this long.
const WriteTimeout = 2 * time.Minute

// Handler returns a private mux with the pprof endpoints under
// /debug/pprof/: the index and the named profiles (heap, goroutine,
// allocs, block, mutex, threadcreate), cmdline, profile (CPU), symbol and
// trace.
func Handler() http.Handler {
	mux := http.NewServeMux()
	mux.HandleFunc("/debug/pprof/", pprof.Index)
	mux.HandleFunc("/debug/pprof/cmdline", pprof.Cmdline)
	mux.HandleFunc("/debug/pprof/profile", pprof.Profile)
	mux.HandleFunc("/debug/pprof/symbol", pprof.Symbol)
	mux.HandleFunc("/debug/pprof/trace", pprof.Trace)
	return mux
}

// Server is a running debug listener. A nil *Server (DEBUG_ADDR empty) is
// valid and does nothing.
type Server struct {
	srv  *http.Server
	addr string
}

// Start listens on addr and serves Handler there until Close. The listener
// is bound before Start returns, so a taken port fails the service's
// start-up instead of a goroutine later. An empty addr means no debug
// listener: Start returns nil, nil.
func Start(addr string, log *slog.Logger) (*Server, error) {
	if addr == "" {
		return nil, nil
	}
	ln, err := net.Listen("tcp", addr)
	if err != nil {
		return nil, fmt.Errorf("debug listener (DEBUG_ADDR=%s): %w", addr, err)
	}
	s := &Server{addr: ln.Addr().String(), srv: &http.Server{
		Handler:           Handler(),
		ReadHeaderTimeout: 5 * time.Second,
		ReadTimeout:       10 * time.Second,
		WriteTimeout:      WriteTimeout,
		IdleTimeout:       2 * time.Minute,
		ErrorLog:          slog.NewLogLogger(log.Handler(), slog.LevelWarn),
	}}
	go func() {
		if err := s.srv.Serve(ln); err != nil && !errors.Is(err, http.ErrServerClosed) {
			// Profiles are a convenience: losing them never stops the
			// service, but it is said.
			log.Error("debug listener stopped", slog.String("debug_addr", s.addr), slog.String("error", err.Error()))
		}
	}()
	log.Info("debug listener started: pprof under /debug/pprof/", slog.String("debug_addr", s.addr))
	return s, nil
}

// Addr returns the address the listener is bound to (with the port chosen
// when addr asked for port 0), or "" for a nil Server.
func (s *Server) Addr() string {
	if s == nil {
		return ""
	}
	return s.addr
}

// Close stops the listener at once, cutting a profile in progress: it runs
// when the service stops, and a profile of a stopping process is of no use.
func (s *Server) Close() error {
	if s == nil {
		return nil
	}
	return s.srv.Close()
}

// CheckAddr validates DEBUG_ADDR: empty (no listener), or host:port on a
// port that none of the public addresses uses on an overlapping host, so
// that profiles can never end up on a public port. A wildcard host ("",
// 0.0.0.0, ::) overlaps every host; port 0 (any free port) overlaps none.
func CheckAddr(debugAddr string, public ...string) error {
	if debugAddr == "" {
		return nil
	}
	host, port, err := net.SplitHostPort(debugAddr)
	if err != nil {
		return fmt.Errorf("%q: want host:port, such as 127.0.0.1:6060", debugAddr)
	}
	if port == "0" {
		return nil
	}
	for _, p := range public {
		ph, pp, err := net.SplitHostPort(p)
		if err != nil || pp != port {
			continue
		}
		if wildcard(host) || wildcard(ph) || host == ph {
			return fmt.Errorf("%q uses the port of the public listener %q: profiles are never served on a public port", debugAddr, p)
		}
	}
	return nil
}

func wildcard(host string) bool { return host == "" || host == "0.0.0.0" || host == "::" }
