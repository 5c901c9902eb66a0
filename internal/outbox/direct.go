package outbox

import (
	"context"
	"errors"
	"fmt"
	"time"

	"github.com/google/uuid"
	"github.com/jackc/pgx/v5"
	"github.com/twmb/franz-go/pkg/kgo"

	"github.com/outboxref/orders/internal/outbox/internal/direct"
	"github.com/outboxref/orders/internal/outbox/internal/outboxdb"
)

// Errors of the direct path, for event types in direct or shadow publish
// mode (O7).
var (
	// and the Writer that wrote its event has no DirectPublisher. The
	// events are written but not sent; the caller must roll back.
	ErrNoDirectPublisher = errors.New("outbox: publish mode needs a direct publisher this writer does not have")
	// ErrDirectPublish matches a failure of the DirectPublisher. The
	// broker may or may not hold the record; the caller must roll back.
	ErrDirectPublish = errors.New("outbox: direct publish failed")
)

// DirectPublisher is the "publish inside the transaction" call a service is
// migrating away from: it sends one event to the broker synchronously and
// returns the record as sent, with the partition and offset the broker
// gave it. Writer.Insert calls it, inside the business transaction, for
// each event whose type is in direct or shadow mode, and logs digests of
// the record in outbox_direct_log. createdAt is the row's created_at, the
// time the relay puts in ce_time.
//
// A DirectPublisher that returns an error fails Insert, and the caller
// rolls back; records it already sent for earlier events of the same call
// stay sent. That is the dual write, and why direct mode is a starting
// point only.
type DirectPublisher func(ctx context.Context, e Event, createdAt time.Time) (*kgo.Record, error)

// WriterOption configures a Writer.
type WriterOption func(*Writer)

// WithDirectPublisher gives the Writer the legacy path it calls for event
// types in direct or shadow mode. A Writer without one refuses such events
// with ErrNoDirectPublisher, so the mode cannot be switched away from
// outbox by mistake on a service that has no legacy path.
func WithDirectPublisher(p DirectPublisher) WriterOption {
	return func(w *Writer) { w.direct = p }
}

// sendDirect runs the direct path for the events Insert wrote in direct or
// shadow mode, in slice order, and logs what was sent, in tx.
func (w *Writer) sendDirect(ctx context.Context, tx pgx.Tx, events []Event, rows []outboxdb.OutboxInsertRow) error {
	type written struct {
		mode    string
		created time.Time
	}
	byID := make(map[uuid.UUID]written, len(rows))
	for _, r := range rows {
		byID[r.EventID] = written{r.PublishMode, r.CreatedAt}
	}
	var log outboxdb.DirectLogInsertParams
	for i := range events {
		e := &events[i]
		wr := byID[e.ID]
		if wr.mode != direct.ModeDirect && wr.mode != direct.ModeShadow {
			continue
		}
		if w.direct == nil {
			return fmt.Errorf("event type %s is in %s mode: %w", e.Type, wr.mode, ErrNoDirectPublisher)
		}
		rec, err := w.direct(ctx, *e, wr.created)
		if err != nil {
			return fmt.Errorf("%w: event %s (%s, %s mode): %w", ErrDirectPublish, e.ID, e.Type, wr.mode, err)
		}
		if rec == nil {
			return fmt.Errorf("direct publish of event %s (%s): the publisher returned no record", e.ID, e.Type)
		}
		d := direct.DigestRecord(rec)
		log.EventIDs = append(log.EventIDs, e.ID)
		log.EventTypes = append(log.EventTypes, e.Type)
		log.Modes = append(log.Modes, wr.mode)
		log.Topics = append(log.Topics, rec.Topic)
		log.KeySha256s = append(log.KeySha256s, d.Key)
		log.ValueSha256s = append(log.ValueSha256s, d.Value)
		log.Headers = append(log.Headers, d.HeadersJSON())
		log.Partitions = append(log.Partitions, rec.Partition)
		log.Offsets = append(log.Offsets, rec.Offset)
	}
	if len(log.EventIDs) == 0 {
		return nil
	}
	if err := outboxdb.New(tx).DirectLogInsert(ctx, log); err != nil {
		return fmt.Errorf("log %d direct sends: %w", len(log.EventIDs), err)
	}
	return nil
}
