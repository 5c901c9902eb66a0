package outbox_test

import (
	"github.com/outboxref/orders/internal/outbox/internal/outboxtest"
)

// The tests share the outbox's test kit, package outboxtest; these are its
// short local names.
const (
	strictType = outboxtest.StrictType
)

var (
	testSchema   = outboxtest.Schema
	testWriter   = outboxtest.TestWriter
	newTestDB    = outboxtest.NewDB
	createTestDB = outboxtest.CreateDB
	event        = outboxtest.Event
	loose        = outboxtest.Loose
	withPayload  = outboxtest.WithPayload
)

// env is one test's world (outboxtest.Env); the Writer's tests use its
// database only.
type env struct{ *outboxtest.Env }
