package relay_test

import (
	"context"
	"log/slog"
	"net"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/require"
	"github.com/twmb/franz-go/pkg/kadm"
	"github.com/twmb/franz-go/pkg/kfake"
	"github.com/twmb/franz-go/pkg/kgo"

	"github.com/outboxref/orders/internal/outbox/relay"
)

// TestEnsureTopic (L1, O3): the outbox creates its topic itself, keeps
// trying while the broker is away, and never changes a topic that exists.
func TestEnsureTopic(t *testing.T) {
	t.Parallel()
	const name = "things.events"

	// partitionsOf returns the topic's partition count, 0 if it is missing.
	partitionsOf := func(t *testing.T, conn []kgo.Opt) int {
		t.Helper()
		cl, err := kgo.NewClient(conn...)
		require.NoError(t, err)
		defer cl.Close()
		td, err := kadm.NewClient(cl).ListTopics(t.Context(), name)
		require.NoError(t, err)
		if !td.Has(name) {
			return 0
		}
		return len(td[name].Partitions)
	}
	cluster := func(t *testing.T, opts ...kfake.Opt) []kgo.Opt {
		t.Helper()
		c, err := kfake.NewCluster(append([]kfake.Opt{kfake.NumBrokers(1)}, opts...)...)
		require.NoError(t, err)
		t.Cleanup(c.Close)
		return []kgo.Opt{kgo.SeedBrokers(c.ListenAddrs()...)}
	}

	t.Run("CreatesAMissingTopic", func(t *testing.T) {
		t.Parallel()
		conn := cluster(t)
		require.Zero(t, partitionsOf(t, conn))
		var logs logBuffer
		require.NoError(t, relay.EnsureTopic(t.Context(), conn, name, 6, slog.New(slog.NewTextHandler(&logs, nil))))
		require.Equal(t, 6, partitionsOf(t, conn))
		require.Contains(t, logs.String(), "kafka topic created")

		// Again: it finds the topic and returns at once, quietly.
		var again logBuffer
		require.NoError(t, relay.EnsureTopic(t.Context(), conn, name, 6, slog.New(slog.NewTextHandler(&again, nil))))
		require.NotContains(t, again.String(), "level=WARN")
	})

	t.Run("ReportsADifferentPartitionCountWithoutChangingIt", func(t *testing.T) {
		t.Parallel()
		conn := cluster(t, kfake.SeedTopics(3, name))
		var logs logBuffer
		require.NoError(t, relay.EnsureTopic(t.Context(), conn, name, 6, slog.New(slog.NewTextHandler(&logs, nil))))
		require.Contains(t, logs.String(), "different partition count")
		require.Contains(t, logs.String(), "existing_partitions=3")
		require.Equal(t, 3, partitionsOf(t, conn), "the topic is left as it is")
	})

	t.Run("WaitsForTheBrokerWithoutBlockingTheCaller", func(t *testing.T) {
		t.Parallel()
		port := freePort(t)
		conn := []kgo.Opt{kgo.SeedBrokers(net.JoinHostPort("127.0.0.1", strconv.Itoa(port)))}
		var logs logBuffer
		done := make(chan error, 1)
		go func() {
			done <- relay.EnsureTopic(t.Context(), conn, name, 6, slog.New(slog.NewTextHandler(&logs, nil)))
		}()

		// The caller goes on while EnsureTopic retries in its goroutine.
		require.Eventually(t, func() bool { return strings.Contains(logs.String(), "retrying in the background") },
			30*time.Second, 20*time.Millisecond, "with no broker, creation fails and is retried")
		select {
		case err := <-done:
			t.Fatalf("EnsureTopic returned while the broker was down: %v", err)
		default:
		}

		c, err := kfake.NewCluster(kfake.NumBrokers(1), kfake.Ports(port))
		require.NoError(t, err)
		t.Cleanup(c.Close)
		select {
		case err := <-done:
			require.NoError(t, err)
		case <-time.After(45 * time.Second):
			t.Fatal("topic not created within 45s of the broker appearing")
		}
		require.Equal(t, 6, partitionsOf(t, conn))
	})

	t.Run("StopsWhenTheContextEnds", func(t *testing.T) {
		t.Parallel()
		conn := []kgo.Opt{kgo.SeedBrokers(net.JoinHostPort("127.0.0.1", strconv.Itoa(freePort(t))))}
		ctx, cancel := context.WithTimeout(t.Context(), 300*time.Millisecond)
		defer cancel()
		began := time.Now()
		err := relay.EnsureTopic(ctx, conn, name, 6, slog.New(slog.DiscardHandler))
		require.ErrorIs(t, err, context.DeadlineExceeded)
		require.Less(t, time.Since(began), 5*time.Second)
	})

	t.Run("RefusesBadArguments", func(t *testing.T) {
		t.Parallel()
		conn := []kgo.Opt{kgo.SeedBrokers("127.0.0.1:1")}
		require.ErrorContains(t, relay.EnsureTopic(t.Context(), conn, "", 6, nil), "empty topic name")
		require.ErrorContains(t, relay.EnsureTopic(t.Context(), conn, name, 0, nil), "0 partitions")
	})
}

// freePort returns a TCP port nothing listens on at the moment.
func freePort(t *testing.T) int {
	t.Helper()
	l, err := net.Listen("tcp", "127.0.0.1:0")
	require.NoError(t, err)
	defer l.Close()
	return l.Addr().(*net.TCPAddr).Port
}
