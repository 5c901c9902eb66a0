package relay_test

import (
	"context"
	"sync"
	"testing"
	"time"

	"github.com/google/uuid"
	"github.com/stretchr/testify/require"
	"github.com/twmb/franz-go/pkg/kfake"

	"github.com/outboxref/orders/internal/outbox/internal/outboxtest"
	"github.com/outboxref/orders/internal/outbox/relay"
)

// The tests share the outbox's test kit, package outboxtest; these are its
// short local names.
const (
	topic      = outboxtest.Topic
	partitions = outboxtest.Partitions
	strictType = outboxtest.StrictType
	looseType  = outboxtest.LooseType
)

var (
	testTypes    = outboxtest.Types
	testWriter   = outboxtest.TestWriter
	testLogger   = outboxtest.Logger
	createTestDB = outboxtest.CreateDB
	event        = outboxtest.Event
	loose        = outboxtest.Loose
	withPayload  = outboxtest.WithPayload
	ids          = outboxtest.IDs
	metricValue  = outboxtest.MetricValue
	start        = outboxtest.Start
)

type (
	row       = outboxtest.Row
	record    = outboxtest.Record
	logBuffer = outboxtest.LogBuffer
	running   = outboxtest.Running
)

// recv is outboxtest.Recv.
func recv[T any](t testing.TB, ch <-chan T, what string) T {
	t.Helper()
	return outboxtest.Recv(t, ch, what)
}

// env is one test's world (outboxtest.Env): a fresh database and a kfake
// cluster.
type env struct{ *outboxtest.Env }

func setup(t testing.TB, opts ...kfake.Opt) *env {
	t.Helper()
	return &env{outboxtest.Setup(t, opts...)}
}

// relayConfig is a relay's Config plus the crash-point hooks that only
// tests can set (export_test.go).
type relayConfig struct {
	relay.Config
	Hooks relay.Hooks
}

// relay builds a relay with test-friendly timings; mod adjusts the config.
func (e *env) relay(t testing.TB, mod func(*relayConfig)) *relay.Relay {
	t.Helper()
	cfg := relayConfig{Config: e.RelayConfig()}
	if mod != nil {
		mod(&cfg)
	}
	r, err := relay.NewRelayWithHooks(cfg.Config, cfg.Hooks)
	require.NoError(t, err)
	return r
}

// claimLog records the claims relays make, from their hooks.
type claimLog struct {
	mu     sync.Mutex
	claims []claimSeen
}

type claimSeen struct {
	at    time.Time
	owner string
	relay.Claim
}

func (l *claimLog) hook(owner string) func(context.Context, []relay.Claim) error {
	return func(_ context.Context, cs []relay.Claim) error {
		now := time.Now()
		l.mu.Lock()
		defer l.mu.Unlock()
		for _, c := range cs {
			l.claims = append(l.claims, claimSeen{at: now, owner: owner, Claim: c})
		}
		return nil
	}
}

func (l *claimLog) all() []claimSeen {
	l.mu.Lock()
	defer l.mu.Unlock()
	return append([]claimSeen(nil), l.claims...)
}

// lease is the row of one partition in outbox_relay_partition.
type lease struct {
	Owner   *string
	Epoch   int64
	Expired bool
}

// leaseOf returns the lease of the partition the event belongs to.
func (e *env) leaseOf(t testing.TB, id uuid.UUID) lease {
	t.Helper()
	var l lease
	require.NoError(t, e.DB.Pool.QueryRow(context.Background(), `
		SELECT p.owner, p.epoch, coalesce(p.lease_expires_at <= now(), false)
		FROM outbox o JOIN outbox_relay_partition p ON p.partition = o.relay_partition
		WHERE o.event_id = $1`, id).Scan(&l.Owner, &l.Epoch, &l.Expired))
	return l
}

// owned returns how many partitions owner holds, whether their leases
// have expired or not.
func (e *env) owned(t testing.TB, owner string) int {
	t.Helper()
	var n int
	require.NoError(t, e.DB.Pool.QueryRow(context.Background(),
		"SELECT count(*) FROM outbox_relay_partition WHERE owner = $1", owner).Scan(&n))
	return n
}

// heldBy returns how many pending rows are in partitions owner holds.
func (e *env) heldBy(t testing.TB, owner string) int {
	t.Helper()
	var n int
	require.NoError(t, e.DB.Pool.QueryRow(context.Background(), `
		SELECT count(*) FROM outbox o JOIN outbox_relay_partition p ON p.partition = o.relay_partition
		WHERE o.state = 'pending' AND p.owner = $1`, owner).Scan(&n))
	return n
}
