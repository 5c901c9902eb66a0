package outbox

import (
	"context"
	"fmt"

	"github.com/google/uuid"
	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"

	"github.com/outboxref/orders/internal/outbox/internal/outboxdb"
)

// DB is the connection EventsOf reads with: a *pgxpool.Pool, a *pgx.Conn
// or a pgx.Tx of the producer's database all satisfy it. It is declared
// here, rather than taken from the generated code, so that callers can
// name it and pass their own wrapper.
type DB interface {
	Exec(ctx context.Context, sql string, args ...any) (pgconn.CommandTag, error)
	Query(ctx context.Context, sql string, args ...any) (pgx.Rows, error)
	QueryRow(ctx context.Context, sql string, args ...any) pgx.Row
}

// EventRef is the identity of one event the outbox wrote: which event_id
// owns which version of its aggregate.
type EventRef struct {
	ID               uuid.UUID
	AggregateVersion int64
	Type             string
}

// EventsOf lists every event written for one aggregate, in version order,
// whether it is still in the outbox or its identity was archived by the
// retention cleanup. It is the producer's answer to a consumer that must
// tell a genuine event from one that only claims a version (C7): the outbox
// is the source of truth for which event_id owns each version, so a record
// with another event_id at that version was not written by this service.
//
// db is the producer's pool or a transaction of it.
func EventsOf(ctx context.Context, db DB, aggregateType, aggregateID string) ([]EventRef, error) {
	rows, err := outboxdb.New(db).OutboxEventsOfAggregate(ctx, outboxdb.OutboxEventsOfAggregateParams{
		AggregateType: aggregateType, AggregateID: aggregateID,
	})
	if err != nil {
		return nil, fmt.Errorf("list events of %s %s: %w", aggregateType, aggregateID, err)
	}
	refs := make([]EventRef, len(rows))
	for i, r := range rows {
		refs[i] = EventRef{ID: r.EventID, AggregateVersion: r.AggregateVersion, Type: r.EventType}
	}
	return refs, nil
}
