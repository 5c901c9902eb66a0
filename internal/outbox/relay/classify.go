package relay

import (
	"context"
	"errors"
	"math/rand/v2"
	"net"
	"time"
	"unicode/utf8"

	"github.com/twmb/franz-go/pkg/kerr"
	"github.com/twmb/franz-go/pkg/kgo"
)

// ErrorClass names why a delivery attempt failed. It is written to the
// row's last_error_class and labels outbox_publish_errors_total, so the
// values are part of the operations contract (runbook, alerts).
type ErrorClass string

// Transient classes: the outcome is unknown or the cause is outside the
// event. The row stays pending and is retried with backoff (R3, R4).
const (
	// ClassTimeout: the broker did not answer before the produce deadline,
	// or answered that it timed out (possibly after storing the record).
	ClassTimeout ErrorClass = "timeout"
	// ClassBrokerUnavailable: the broker could not be reached.
	ClassBrokerUnavailable ErrorClass = "broker_unavailable"
	// ClassUnknownTopic: the topic does not exist (yet).
	ClassUnknownTopic ErrorClass = "unknown_topic"
	// ClassAuth: SASL or ACL refused the producer. Retried rather than
	// parked: it is a configuration problem that would otherwise park every
	// event in the table.
	ClassAuth ErrorClass = "auth"
	// ClassBroker: any other broker or client error.
	ClassBroker ErrorClass = "broker_error"
	// ClassShutdown: the relay stopped before the broker answered; the
	// lease is released with no delay for a successor.
	ClassShutdown ErrorClass = "shutdown"
)

// Deterministic classes: sending the row again fails the same way, so it is
// parked with its reason (R5) until an operator repairs and resumes it (O4).
// A payload that fails its JSON Schema has no class: the Writer refuses it
// before it is written.
const (
	// ClassMessageTooLarge: the record is over the producer's or the
	// broker's size limit.
	ClassMessageTooLarge ErrorClass = "message_too_large"
	// ClassInvalidRecord: the broker refused the record as malformed.
	ClassInvalidRecord ErrorClass = "invalid_record"
	// ClassUnknownEventType: the row's event type is not in Config.Types.
	ClassUnknownEventType ErrorClass = "unknown_event_type"
	// ClassUnknownSchemaVersion: the event type has no such schema version
	// in Config.Types.
	ClassUnknownSchemaVersion ErrorClass = "unknown_schema_version"
)

// Parks reports whether an event that failed with this class is parked
// rather than retried.
func (c ErrorClass) Parks() bool {
	switch c {
	case ClassMessageTooLarge, ClassInvalidRecord, ClassUnknownEventType, ClassUnknownSchemaVersion:
		return true
	default:
		return false
	}
}

// errShutdown is the cause given to in-flight produces cancelled because
// the relay is stopping.
var errShutdown = errors.New("relay stopped before the broker answered")

// classifyProduce maps the error of one produce to its class. pctx is the
// produce context, whose cause tells a shutdown from a deadline.
func classifyProduce(pctx context.Context, err error) ErrorClass {
	switch {
	case errors.Is(err, errShutdown):
		return ClassShutdown
	case errors.Is(err, context.Canceled) || errors.Is(err, context.DeadlineExceeded):
		if errors.Is(context.Cause(pctx), errShutdown) {
			return ClassShutdown
		}
		return ClassTimeout
	case errors.Is(err, kgo.ErrRecordTimeout),
		errors.Is(err, kerr.RequestTimedOut),
		errors.Is(err, kerr.NotEnoughReplicasAfterAppend):
		return ClassTimeout
	case errors.Is(err, kerr.MessageTooLarge), errors.Is(err, kerr.RecordListTooLarge):
		return ClassMessageTooLarge
	case errors.Is(err, kerr.InvalidRecord):
		return ClassInvalidRecord
	case errors.Is(err, kerr.UnknownTopicOrPartition), errors.Is(err, kerr.UnknownTopicID):
		return ClassUnknownTopic
	case errors.Is(err, kerr.TopicAuthorizationFailed),
		errors.Is(err, kerr.ClusterAuthorizationFailed),
		errors.Is(err, kerr.SaslAuthenticationFailed),
		errors.Is(err, kerr.UnsupportedSaslMechanism),
		errors.Is(err, kerr.IllegalSaslState):
		return ClassAuth
	}
	var ne net.Error
	if errors.As(err, &ne) || errors.Is(err, kgo.ErrClientClosed) {
		return ClassBrokerUnavailable
	}
	return ClassBroker
}

// backoff is the delay before attempt number attempts+1, for a row that has
// now failed attempts times: base, 2·base, 4·base ... capped at max, with
// "equal jitter" (a uniform draw in the upper half) so that relays which
// failed together on one outage do not come back together (R4).
func backoff(attempts int, base, max time.Duration) time.Duration {
	d := base
	for i := 1; i < attempts && d < max; i++ {
		d *= 2
	}
	if d > max || d <= 0 {
		d = max
	}
	half := d / 2
	return half + rand.N(d-half+1)
}

// maxErrorText is the CHECK on outbox.last_error.
const maxErrorText = 1024

// boundText cuts s to at most maxErrorText characters (the CHECK counts
// characters), keeping valid UTF-8.
func boundText(s string) string {
	if utf8.RuneCountInString(s) <= maxErrorText {
		return s
	}
	n := 0
	for i := range s {
		if n == maxErrorText-1 {
			return s[:i] + "…"
		}
		n++
	}
	return s
}
