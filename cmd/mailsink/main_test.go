package main

import (
	"context"
	"encoding/json"
	"io"
	"net"
	"net/http"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/outboxref/orders/internal/notify"
)

func freeAddr(t *testing.T) string {
	t.Helper()
	l, err := net.Listen("tcp", "127.0.0.1:0")
	require.NoError(t, err)
	defer l.Close()
	return l.Addr().String()
}

// TestSink sends one message through the notifier's SMTP client and reads
// it back over HTTP.
func TestSink(t *testing.T) {
	t.Parallel()
	smtpAddr, httpAddr := freeAddr(t), freeAddr(t)
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	env := map[string]string{"MAILSINK_SMTP_ADDR": smtpAddr, "MAILSINK_HTTP_ADDR": httpAddr}
	go func() { done <- run(ctx, func(k string) string { return env[k] }, io.Discard) }()

	m := &notify.SMTPMailer{Addr: smtpAddr, Timeout: 5 * time.Second}
	msg := "Message-ID: <e1@notifier.outboxref>\r\nSubject: =?utf-8?q?Order_=C3=A9?=\r\n\r\nhello\r\n"
	require.Eventually(t, func() bool {
		_, err := m.Send(ctx, "orders@shop.test", "alice@example.com", []byte(msg))
		return err == nil
	}, 10*time.Second, 50*time.Millisecond)

	resp, err := http.Get("http://" + httpAddr + "/api/messages")
	require.NoError(t, err)
	defer resp.Body.Close()
	var got []Message
	require.NoError(t, json.NewDecoder(resp.Body).Decode(&got))
	require.Len(t, got, 1)
	require.Equal(t, "<e1@notifier.outboxref>", got[0].MessageID)
	require.Equal(t, "Order é", got[0].Subject)
	require.Equal(t, []string{"alice@example.com"}, got[0].To)

	cancel()
	require.NoError(t, <-done)
}
