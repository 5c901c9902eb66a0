// Package healthcheck lets a service probe its own readiness endpoint, so
// that a container image with no shell, curl or wget can still have a
// health check: the binary calls itself (`orders healthcheck`) and exits
// non-zero unless the running server answers 200.
package healthcheck

import (
	"context"
	"fmt"
	"io"
	"net"
	"net/http"
	"time"
)

// Timeout bounds one probe. It stays below the interval of a typical
// container health check, so a hung server fails the probe instead of
// stacking probes up.
const Timeout = 3 * time.Second

// URL returns the http URL of path on a server that listens on listenAddr.
// A wildcard host (":8080", "0.0.0.0:8080", "[::]:8080") is probed on
// loopback, which is where a probe running next to the server reaches it.
func URL(listenAddr, path string) (string, error) {
	host, port, err := net.SplitHostPort(listenAddr)
	if err != nil {
		return "", fmt.Errorf("listen address %q: %w", listenAddr, err)
	}
	switch host {
	case "", "0.0.0.0":
		host = "127.0.0.1"
	case "::":
		host = "::1"
	}
	return "http://" + net.JoinHostPort(host, port) + path, nil
}

// Check fetches url and returns nil only when it answers 200 within Timeout.
func Check(ctx context.Context, url string) error {
	ctx, cancel := context.WithTimeout(ctx, Timeout)
	defer cancel()
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, url, nil)
	if err != nil {
		return fmt.Errorf("probe %s: %w", url, err)
	}
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		return fmt.Errorf("probe %s: %w", url, err)
	}
	defer resp.Body.Close()
	_, _ = io.Copy(io.Discard, io.LimitReader(resp.Body, 64<<10))
	if resp.StatusCode != http.StatusOK {
		return fmt.Errorf("probe %s: %s", url, resp.Status)
	}
	return nil
}

// Run probes path on the server listening on listenAddr and reports the
// result on stdout; it is the whole of a binary's `healthcheck` command.
func Run(ctx context.Context, listenAddr, path string, stdout io.Writer) error {
	url, err := URL(listenAddr, path)
	if err != nil {
		return err
	}
	if err := Check(ctx, url); err != nil {
		return err
	}
	fmt.Fprintln(stdout, "ready:", url)
	return nil
}
