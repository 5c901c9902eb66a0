package operate_test

import (
	"testing"

	"github.com/stretchr/testify/require"
	"github.com/twmb/franz-go/pkg/kfake"

	"github.com/outboxref/orders/internal/outbox/internal/outboxtest"
	"github.com/outboxref/orders/internal/outbox/relay"
)

// The tests share the outbox's test kit, package outboxtest; these are its
// short local names.
const (
	topic      = outboxtest.Topic
	strictType = outboxtest.StrictType
	looseType  = outboxtest.LooseType
)

var (
	testTypes   = outboxtest.Types
	testWriter  = outboxtest.TestWriter
	testLogger  = outboxtest.Logger
	event       = outboxtest.Event
	loose       = outboxtest.Loose
	withPayload = outboxtest.WithPayload
	ids         = outboxtest.IDs
	metricValue = outboxtest.MetricValue
	start       = outboxtest.Start
)

type (
	row     = outboxtest.Row
	record  = outboxtest.Record
	running = outboxtest.Running
)

// env is one test's world (outboxtest.Env): a fresh database and a kfake
// cluster.
type env struct{ *outboxtest.Env }

func setup(t testing.TB, opts ...kfake.Opt) *env {
	t.Helper()
	return &env{outboxtest.Setup(t, opts...)}
}

// relayConfig is the Config of the relay the operations' tests run beside
// the Admin.
type relayConfig = relay.Config

// relay builds a relay with test-friendly timings; mod adjusts the config.
func (e *env) relay(t testing.TB, mod func(*relayConfig)) *relay.Relay {
	t.Helper()
	cfg := e.RelayConfig()
	if mod != nil {
		mod(&cfg)
	}
	r, err := relay.NewRelay(cfg)
	require.NoError(t, err)
	return r
}
