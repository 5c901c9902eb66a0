package orders

import (
	"context"
	"syscall"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/stretchr/testify/require"
	pgxuuid "github.com/vgarvardt/pgx-google-uuid/v5"

	"github.com/outboxref/orders/internal/outbox"
)

// BenchmarkCommands measures the write path of W1 against real PostgreSQL:
// one transaction per command holding the business write and its outbox
// rows. Clients run in parallel (-cpu sets how many).
//
//	go test ./internal/orders -run '^$' -bench Commands -benchtime 2000x
//
// CreateSchemaChecked is Create with a Writer that also checks each payload
// against its JSON Schema on insert (outbox.WithSchemaCheckOnInsert): the
// two side by side give what that check costs per create.
func BenchmarkCommands(b *testing.B) {
	f := setup(b)
	ctx := context.Background()
	// The pool as orders serve opens it (cmd/orders openPool): with the
	// google/uuid codec registered on each connection.
	cfg := f.pool.Config()
	cfg.AfterConnect = func(_ context.Context, conn *pgx.Conn) error {
		pgxuuid.Register(conn.TypeMap())
		return nil
	}
	pool, err := pgxpool.NewWithConfig(ctx, cfg)
	require.NoError(b, err)
	b.Cleanup(pool.Close)
	f.pool = pool
	f.svc, err = NewService(pool, WithLogger(f.svc.log))
	require.NoError(b, err)
	create := func(svc *Service) func(b *testing.B) {
		return func(b *testing.B) {
			cpu := processCPU(b)
			b.RunParallel(func(pb *testing.PB) {
				for pb.Next() {
					if _, _, err := svc.Place(ctx, alice, PlaceOrder{Input: newInput()}); err != nil {
						b.Error(err)
						return
					}
				}
			})
			cpu()
		}
	}
	types, err := EventTypes()
	require.NoError(b, err)
	checking, err := outbox.NewWriter(types, outbox.WithSchemaCheckOnInsert())
	require.NoError(b, err)
	checked, err := NewService(f.pool, WithLogger(f.svc.log), WithWriter(checking))
	require.NoError(b, err)

	b.Run("Create", create(f.svc))
	b.Run("CreateSchemaChecked", create(checked))
	b.Run("CreatePayCancel", func(b *testing.B) {
		// Four events in three transactions; the cancel writes two.
		b.RunParallel(func(pb *testing.PB) {
			for pb.Next() {
				o, _, err := f.svc.Place(ctx, alice, PlaceOrder{Input: newInput()})
				if err == nil {
					_, err = f.svc.Pay(ctx, alice, PayOrder{ID: o.ID, ExpectedVersion: 1})
				}
				if err == nil {
					_, err = f.svc.Cancel(ctx, alice, CancelOrder{ID: o.ID, ExpectedVersion: 2})
				}
				if err != nil {
					b.Error(err)
					return
				}
			}
		})
	})
}

// BenchmarkEventChecks measures, without a database, what a create's
// events cost before they reach it: the order.placed payload built and
// encoded, checked by the Writer and queued as the outbox insert, with the
// service's Writer (Trusted: no JSON Schema check on insert) and with one
// that checks the schema on insert (SchemaChecked). Single-threaded and
// CPU-bound, so its time per operation holds up on a shared machine.
func BenchmarkEventChecks(b *testing.B) {
	types, err := EventTypes()
	require.NoError(b, err)
	ctx := context.Background()
	for _, opts := range []struct {
		name string
		opts []outbox.WriterOption
	}{{"Trusted", nil}, {"SchemaChecked", []outbox.WriterOption{outbox.WithSchemaCheckOnInsert()}}} {
		w, err := outbox.NewWriter(types, opts.opts...)
		require.NoError(b, err)
		o := newOrder()
		b.Run(opts.name, func(b *testing.B) {
			b.ReportAllocs()
			for b.Loop() {
				events, err := toEvents(PlaceOrder{}.emits(), o)
				if err == nil {
					_, err = w.Queue(ctx, &pgx.Batch{}, events)
				}
				if err != nil {
					b.Fatal(err)
				}
			}
		})
	}
}

// processCPU starts counting the CPU time of this process (user and
// system, every thread: the service's side of a command, without the
// database's) and returns the function that reports it per operation as
// cpu-µs/op. On a shared machine the wall time per operation follows
// whatever else runs; the CPU it took does much less.
func processCPU(b *testing.B) (report func()) {
	b.Helper()
	start := cpuTime(b)
	return func() {
		b.ReportMetric(float64((cpuTime(b)-start).Microseconds())/float64(b.N), "cpu-µs/op")
	}
}

func cpuTime(b *testing.B) time.Duration {
	var ru syscall.Rusage
	require.NoError(b, syscall.Getrusage(syscall.RUSAGE_SELF, &ru))
	return time.Duration(ru.Utime.Nano() + ru.Stime.Nano())
}
