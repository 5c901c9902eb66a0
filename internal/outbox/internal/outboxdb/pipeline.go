package outboxdb

import (
	"context"
	"time"

	"github.com/google/uuid"
	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"
)

// The relay's read and confirm are each sent with the session setting
// they need in one pgx.Batch. A batch ends with a single Sync, so its
// statements run in one implicit transaction, and a setting made local
// with set_config(..., true) holds for the statement after it and ends
// with the batch. One round trip instead of four (BEGIN, the setting, the
// statement, COMMIT): at thousands of events a second in batches of a
// hundred, the round trips are a good part of the relay's time.

// Batcher is what runs a pgx.Batch: a *pgxpool.Pool, a *pgxpool.Conn, a
// *pgx.Conn.
type Batcher interface {
	SendBatch(ctx context.Context, b *pgx.Batch) pgx.BatchResults
}

// CustomPlan is set before the relay's statements that update a batch's
// rows by id (the confirm, the release, the shadow settle): each execution is planned for the
// table as it is and for the batch's ids. pgx prepares a statement once per
// connection, and after five executions PostgreSQL may keep a generic plan
// made for the table as it was then: one made while the outbox was nearly
// empty scans it whole, cheap then, and once a burst has grown the table
// every confirm would pay for all of it. Together with the statements'
// own shape (OutboxConfirm, in queries/outbox.sql) this keeps each of them
// at one primary-key lookup per id; planning a short statement costs a
// fraction of a millisecond per batch. plan_test.go,
// TestConfirmPlansForTheTableAsItIs, checks both.
const CustomPlan = "SELECT " + planAfresh

const planAfresh = "set_config('plan_cache_mode', 'force_custom_plan', true)"

// RelaxedCommit is set before the relay's confirm: it commits without
// waiting for the WAL flush (see the relay's settle), and is planned as
// CustomPlan says.
const RelaxedCommit = "SELECT set_config('synchronous_commit', 'off', true), " + planAfresh

// OutboxReadInIndexOrder runs OutboxRead after ClaimInIndexOrder, in one
// round trip.
func OutboxReadInIndexOrder(ctx context.Context, db Batcher, arg OutboxReadParams) ([]OutboxReadRow, error) {
	return New(Prefixed{DB: db, Setting: ClaimInIndexOrder}).OutboxRead(ctx, arg)
}

// OutboxReadFloorInIndexOrder runs OutboxReadFloor after
// ClaimInIndexOrder, in one round trip.
func OutboxReadFloorInIndexOrder(ctx context.Context, db Batcher, arg OutboxReadFloorParams) (time.Time, error) {
	return New(Prefixed{DB: db, Setting: ClaimInIndexOrder}).OutboxReadFloor(ctx, arg)
}

// OutboxConfirmRelaxed runs OutboxConfirm after RelaxedCommit, in one
// round trip.
func OutboxConfirmRelaxed(ctx context.Context, db Batcher, arg OutboxConfirmParams) ([]uuid.UUID, error) {
	return New(Prefixed{DB: db, Setting: RelaxedCommit}).OutboxConfirm(ctx, arg)
}

// OutboxReleaseCustomPlan runs OutboxRelease after CustomPlan, in one
// round trip.
func OutboxReleaseCustomPlan(ctx context.Context, db Batcher, arg OutboxReleaseParams) ([]uuid.UUID, error) {
	return New(Prefixed{DB: db, Setting: CustomPlan}).OutboxRelease(ctx, arg)
}

// ShadowSettleCustomPlan runs ShadowSettle after CustomPlan, in one
// round trip.
func ShadowSettleCustomPlan(ctx context.Context, db Batcher, arg ShadowSettleParams) ([]uuid.UUID, error) {
	return New(Prefixed{DB: db, Setting: CustomPlan}).ShadowSettle(ctx, arg)
}

// OutboxConfirmThenRead runs OutboxConfirmRelaxed and then
// OutboxReadInIndexOrder in one round trip. All of it is one implicit
// transaction: the read sees the rows just confirmed as delivered, a
// failure anywhere undoes the confirm, and the commit does not wait for
// the WAL flush, as the confirm's own would not (the read writes nothing).
// The ids confirmed count only when err is nil. The confirm reuses the
// generated statement, as queue.go does; keep its arguments in step with
// OutboxConfirm.
func OutboxConfirmThenRead(ctx context.Context, db Batcher, confirm OutboxConfirmParams, read OutboxReadParams) ([]uuid.UUID, []OutboxReadRow, error) {
	var ids []uuid.UUID
	rows, err := New(Prefixed{DB: db, Setting: ClaimInIndexOrder, Ahead: []Statement{
		{SQL: RelaxedCommit},
		{SQL: outboxConfirm, Args: []any{
			confirm.EventIDs,
			confirm.Partitions,
			confirm.Offsets,
			confirm.FencePartitions,
			confirm.FenceEpochs,
			confirm.Owner,
		}, Rows: func(rows pgx.Rows) (err error) {
			ids, err = pgx.CollectRows(rows, pgx.RowTo[uuid.UUID])
			return err
		}},
	}}).OutboxRead(ctx, read)
	if err != nil {
		return nil, nil, err
	}
	return ids, rows, nil
}

// Prefixed is a DBTX that sends Setting ahead of each statement, in one
// batch and so in one implicit transaction, for the generated queries to
// run unchanged. Ahead, if set, goes first in the same batch. The batch's
// commit happens at its end, after the statement's rows: its outcome (a
// failed commit means nothing the batch did happened) is reported by the
// rows' Err, by Exec, and by QueryRow's Scan.
type Prefixed struct {
	DB      Batcher
	Setting string
	Ahead   []Statement
}

// Statement is one statement of a batch. Rows, if set, reads what it
// returns; otherwise its rows are discarded.
type Statement struct {
	SQL  string
	Args []any
	Rows func(pgx.Rows) error
}

func (p Prefixed) send(ctx context.Context, sql string, args []any) (pgx.BatchResults, error) {
	b := &pgx.Batch{}
	for _, st := range p.Ahead {
		b.Queue(st.SQL, st.Args...)
	}
	b.Queue(p.Setting)
	b.Queue(sql, args...)
	br := p.DB.SendBatch(ctx, b)
	for _, st := range p.Ahead {
		if err := st.read(br); err != nil {
			_ = br.Close()
			return nil, err
		}
	}
	if _, err := br.Exec(); err != nil {
		_ = br.Close()
		return nil, err
	}
	return br, nil
}

func (st Statement) read(br pgx.BatchResults) error {
	if st.Rows == nil {
		_, err := br.Exec()
		return err
	}
	rows, err := br.Query()
	if err != nil {
		return err
	}
	defer rows.Close()
	if err := st.Rows(rows); err != nil {
		return err
	}
	rows.Close()
	return rows.Err()
}

// Exec runs a statement that returns no rows.
func (p Prefixed) Exec(ctx context.Context, sql string, args ...any) (pgconn.CommandTag, error) {
	br, err := p.send(ctx, sql, args)
	if err != nil {
		return pgconn.CommandTag{}, err
	}
	tag, err := br.Exec()
	if cerr := br.Close(); err == nil {
		err = cerr
	}
	return tag, err
}

// Query runs a statement that returns rows.
func (p Prefixed) Query(ctx context.Context, sql string, args ...any) (pgx.Rows, error) {
	br, err := p.send(ctx, sql, args)
	if err != nil {
		return nil, err
	}
	rows, err := br.Query()
	if err != nil {
		_ = br.Close()
		return nil, err
	}
	return &batchRows{Rows: rows, br: br}, nil
}

// QueryRow runs a statement that returns at most one row.
func (p Prefixed) QueryRow(ctx context.Context, sql string, args ...any) pgx.Row {
	rows, err := p.Query(ctx, sql, args...)
	return batchRow{rows: rows, err: err}
}

// batchRows are a statement's rows that close their batch once read to
// the end, so that Err, which the generated code asks after the last row,
// reports the commit too.
type batchRows struct {
	pgx.Rows
	br       pgx.BatchResults
	closed   bool
	closeErr error
}

func (r *batchRows) Next() bool {
	if r.Rows.Next() {
		return true
	}
	r.Close()
	return false
}

func (r *batchRows) Close() {
	if r.closed {
		return
	}
	r.closed = true
	r.Rows.Close()
	r.closeErr = r.br.Close()
}

func (r *batchRows) Err() error {
	if err := r.Rows.Err(); err != nil {
		return err
	}
	return r.closeErr
}

type batchRow struct {
	rows pgx.Rows
	err  error
}

func (r batchRow) Scan(dest ...any) error {
	if r.err != nil {
		return r.err
	}
	defer r.rows.Close()
	if !r.rows.Next() {
		if err := r.rows.Err(); err != nil {
			return err
		}
		return pgx.ErrNoRows
	}
	if err := r.rows.Scan(dest...); err != nil {
		return err
	}
	r.rows.Close()
	return r.rows.Err()
}

var _ DBTX = Prefixed{}
