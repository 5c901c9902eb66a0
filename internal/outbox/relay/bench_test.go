package relay_test

import (
	"context"
	"fmt"
	"testing"
	"time"

	"github.com/outboxref/orders/internal/outbox"
)

// BenchmarkRelayDrain measures how fast relays drain a committed backlog
// into the broker: real PostgreSQL, kfake over TCP, the relay's real claim,
// produce and fenced confirm. It reports events/s for a fixed backlog of
// 2,000 events over 200 aggregates; each iteration drains a fresh one, so
// -benchtime=1x is one drain (what CI can afford) and 5x averages five.
//
//	go test ./internal/outbox -run '^$' -bench RelayDrain -benchtime=3x
func BenchmarkRelayDrain(b *testing.B) {
	aggregates, versions := 200, int64(10) // versions: events per aggregate
	if testing.Short() {
		aggregates, versions = 20, 2 // make bench-smoke: proves it runs, measures nothing
	}
	for _, bc := range []struct {
		name   string
		relays int
		loose  bool
	}{
		{"Strict/1Relay", 1, false},
		{"Strict/4Relays", 4, false},
		{"Independent/1Relay", 1, true},
	} {
		b.Run(bc.name, func(b *testing.B) {
			var total time.Duration
			for b.Loop() {
				b.StopTimer()
				e := setup(b)
				var evs []outbox.Event
				for v := int64(1); v <= versions; v++ {
					for a := range aggregates {
						ev := event(fmt.Sprintf("agg-%d", a), v)
						if bc.loose {
							loose(&ev)
						}
						evs = append(evs, ev)
					}
				}
				e.Insert(b, evs...)
				b.StartTimer()

				began := time.Now()
				var rs []*running
				for i := range bc.relays {
					rs = append(rs, start(b, e.relay(b, func(c *relayConfig) {
						c.Owner = fmt.Sprintf("bench-%d", i)
						c.BatchSize = 200
						c.PollInterval = 20 * time.Millisecond
					})))
				}
				for pending := len(evs); pending > 0; {
					if err := e.DB.Pool.QueryRow(context.Background(),
						"SELECT count(*) FROM outbox WHERE state <> 'delivered'").Scan(&pending); err != nil {
						b.Fatal(err)
					}
					if time.Since(began) > 2*time.Minute {
						b.Fatalf("%d events still undelivered after 2 minutes", pending)
					}
					time.Sleep(5 * time.Millisecond) // polling the database for completion
				}
				total += time.Since(began)
				b.StopTimer()
				for _, r := range rs {
					_ = r.Stop(b)
				}
				b.StartTimer()
			}
			b.ReportMetric(float64(int64(aggregates)*versions*int64(b.N))/total.Seconds(), "events/s")
		})
	}
}
