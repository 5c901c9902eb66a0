// Package drainloop drains the outbox with the relay's own claim and
// confirm statements and no broker: claim a batch, confirm it at made-up
// broker positions, repeat. It is the ceiling a relay's throughput is
// measured against (cmd/bench): what the relay could reach if sending
// cost nothing. It is for benchmarks only; it marks rows delivered that
// were never sent.
//
// It lives in the outbox's directory because the statements it runs are
// the outbox's generated code, which is private to the unit.
package drainloop

import (
	"context"
	"fmt"

	"github.com/google/uuid"

	"github.com/outboxref/orders/internal/outbox/internal/outboxdb"
)

// Drain claims and confirms batches of at most batch rows on db until a
// claim comes back empty, treating every event type as strictly ordered,
// and returns how many rows it confirmed. db is a connection or a
// transaction of the outbox's database (a *pgxpool.Conn, a pgx.Tx).
func Drain(ctx context.Context, db outboxdb.DBTX, batch int) (int, error) {
	q := outboxdb.New(db)
	var n int
	var offset int64
	for {
		token := uuid.New()
		rows, err := q.OutboxClaim(ctx, outboxdb.OutboxClaimParams{
			LeaseOwner: "bench-sql-loop", LeaseToken: token, LeaseSeconds: 30,
			IndependentTypes: []string{}, BatchSize: int32(batch),
		})
		if err != nil {
			return n, fmt.Errorf("claim: %w", err)
		}
		if len(rows) == 0 {
			return n, nil
		}
		p := outboxdb.OutboxConfirmParams{LeaseToken: token}
		for _, r := range rows {
			p.EventIDs = append(p.EventIDs, r.EventID)
			p.Partitions = append(p.Partitions, int32(offset%6))
			p.Offsets = append(p.Offsets, offset)
			offset++
		}
		done, err := q.OutboxConfirm(ctx, p)
		if err != nil {
			return n, fmt.Errorf("confirm: %w", err)
		}
		n += len(done)
	}
}
