package relay_test

import (
	"context"
	"sync"
	"testing"
	"time"

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
