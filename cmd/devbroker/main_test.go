package main

import (
	"bytes"
	"context"
	"errors"
	"net"
	"sync"
	"testing"
	"time"

	"github.com/stretchr/testify/require"
	"github.com/twmb/franz-go/pkg/kadm"
	"github.com/twmb/franz-go/pkg/kgo"

	"github.com/outboxref/orders/internal/testlog"
)

// start runs the broker until the test ends and returns its address.
func start(t *testing.T, vars map[string]string) (addr string, stop func()) {
	t.Helper()
	ctx, cancel := context.WithCancel(context.Background())
	ready := make(chan string, 1)
	done := make(chan error, 1)
	var out testlog.Buffer
	go func() {
		done <- run(ctx, nil, func(k string) string { return vars[k] }, &out, func(a string) { ready <- a })
	}()
	select {
	case addr = <-ready:
	case err := <-done:
		t.Fatalf("devbroker exited: %v", err)
	case <-time.After(30 * time.Second):
		t.Fatal("devbroker not ready within 30s")
	}
	require.Contains(t, out.String(), "kcat -b "+addr)
	var once sync.Once
	stop = func() {
		once.Do(func() {
			cancel()
			require.NoError(t, <-done)
		})
	}
	t.Cleanup(stop)
	return addr, stop
}

func TestDevBrokerTopicAndPersistence(t *testing.T) {
	t.Parallel()
	dir := t.TempDir()
	vars := map[string]string{
		"DEVBROKER_ADDR":          "127.0.0.1:" + freePort(t),
		"DEVBROKER_DATA_DIR":      dir,
		"ORDERS_TOPIC":            "orders.events",
		"ORDERS_TOPIC_PARTITIONS": "6",
	}
	addr, stop := start(t, vars)
	cl, err := kgo.NewClient(kgo.SeedBrokers(addr), kgo.DefaultProduceTopic("orders.events"))
	require.NoError(t, err)
	td, err := kadm.NewClient(cl).ListTopics(context.Background(), "orders.events")
	require.NoError(t, err)
	require.Len(t, td["orders.events"].Partitions, 6)
	require.NoError(t, cl.ProduceSync(context.Background(), &kgo.Record{Key: []byte("k"), Value: []byte("survives")}).FirstErr())
	cl.Close()
	stop()

	// Same data dir, same port: the record is still there.
	addr, _ = start(t, vars)
	cons, err := kgo.NewClient(kgo.SeedBrokers(addr), kgo.ConsumeTopics("orders.events"), kgo.ConsumeResetOffset(kgo.NewOffset().AtStart()))
	require.NoError(t, err)
	defer cons.Close()
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()
	for {
		fs := cons.PollFetches(ctx)
		require.NoError(t, ctx.Err(), "record not found after restart")
		var found bool
		fs.EachRecord(func(r *kgo.Record) { found = found || string(r.Value) == "survives" })
		if found {
			return
		}
	}
}

func TestDevBrokerRefusesBadAddr(t *testing.T) {
	t.Parallel()
	err := run(context.Background(), []string{"-addr", "nope"}, func(string) string { return "" }, &bytes.Buffer{}, nil)
	require.ErrorContains(t, err, "host:port")
}

func freePort(t *testing.T) string {
	t.Helper()
	l, err := net.Listen("tcp", "127.0.0.1:0")
	require.NoError(t, err)
	defer l.Close()
	_, port, err := net.SplitHostPort(l.Addr().String())
	require.NoError(t, err)
	return port
}

// TestDevBrokerClosesIdleConnections: a connection that sends nothing is
// closed after DEVBROKER_IDLE_TIMEOUT, so abandoned connections do not pile
// up; a client that keeps talking is not affected, and one whose
// connection was closed reconnects on its next request.
func TestDevBrokerClosesIdleConnections(t *testing.T) {
	t.Parallel()
	addr, _ := start(t, map[string]string{"DEVBROKER_ADDR": "127.0.0.1:" + freePort(t), "DEVBROKER_IDLE_TIMEOUT": "1s"})

	idle, err := net.Dial("tcp", addr)
	require.NoError(t, err)
	defer idle.Close()
	require.NoError(t, idle.SetReadDeadline(time.Now().Add(10*time.Second)))
	start := time.Now()
	_, err = idle.Read(make([]byte, 1))
	require.Error(t, err, "the broker closes a silent connection")
	var ne net.Error
	require.False(t, errors.As(err, &ne) && ne.Timeout(), "closed by the broker, not timed out here: %v", err)
	require.Less(t, time.Since(start), 9*time.Second)

	cl, err := kgo.NewClient(kgo.SeedBrokers(addr), kgo.DefaultProduceTopic("orders.events"))
	require.NoError(t, err)
	defer cl.Close()
	for range 3 {
		require.NoError(t, cl.ProduceSync(context.Background(), &kgo.Record{Value: []byte("x")}).FirstErr())
		time.Sleep(1500 * time.Millisecond) // longer than the idle timeout: the next produce reconnects
	}
}
