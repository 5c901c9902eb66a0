package orders

import (
	"context"
	"testing"
)

// BenchmarkCommands measures the write path of W1 against real PostgreSQL:
// one transaction per command holding the business write and its outbox
// rows. Clients run in parallel (-cpu sets how many).
//
//	go test ./internal/orders -run '^$' -bench Commands -benchtime 2000x
func BenchmarkCommands(b *testing.B) {
	f := setup(b)
	ctx := context.Background()

	b.Run("Create", func(b *testing.B) {
		b.RunParallel(func(pb *testing.PB) {
			for pb.Next() {
				if _, _, err := f.svc.Place(ctx, alice, PlaceOrder{Input: newInput()}); err != nil {
					b.Error(err)
					return
				}
			}
		})
	})
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
