package e2e

import (
	"context"
	"fmt"
	"math/rand/v2"
	"regexp"
	"slices"
	"strconv"
	"testing"
	"time"

	"github.com/google/uuid"
	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/stretchr/testify/require"

	"github.com/outboxref/orders/internal/notify"
	"github.com/outboxref/orders/internal/notify/smtptest"
)

// chaosStep is one fault of the soak's schedule, due once at least `at`
// orders have been driven to the end of their plans. Tying the schedule to
// progress rather than to the clock spreads the faults over the whole load
// however fast or slow the machine is, and keeps a seed's schedule the same.
type chaosStep struct {
	at   int
	what string // "orders" or "notifier" (SIGKILL and restart), or "terminate"
}

func (s chaosStep) String() string { return fmt.Sprintf("%s@%d", s.what, s.at) }

// soakSchedule draws kills kills, split evenly between the two services,
// and terminations rounds of pg_terminate_backend, at random points
// between 3% and 97% of the load.
func soakSchedule(rng *rand.Rand, orders, kills, terminations int) []chaosStep {
	lo, hi := orders*3/100, orders*97/100
	targets := make([]string, kills)
	for i := range targets {
		targets[i] = []string{"orders", "notifier"}[i%2]
	}
	rng.Shuffle(len(targets), func(i, j int) { targets[i], targets[j] = targets[j], targets[i] })
	var steps []chaosStep
	for _, what := range targets {
		steps = append(steps, chaosStep{at: lo + rng.IntN(hi-lo+1), what: what})
	}
	for range terminations {
		steps = append(steps, chaosStep{at: lo + rng.IntN(hi-lo+1), what: "terminate"})
	}
	slices.SortStableFunc(steps, func(a, b chaosStep) int { return a.at - b.at })
	return steps
}

// emailingTypes are the events that send the customer an email.
var emailingTypes = map[string]bool{
	"order.placed": true, "order.paid": true, "order.cancelled": true, "order.shipped": true,
}

// TestSoak runs orders (API and relay) and the notifier under a load of
// mixed commands from concurrent clients while both processes are killed
// with SIGKILL at random moments and restarted, and their database sessions
// are terminated in rounds. At the end every committed event was delivered
// and is on the topic unchanged, the notifier applied each exactly once and
// its projection matches the orders, and each emailing event sent at most
// one email (exactly one unless a kill cut its send short, which leaves it
// `unknown` for an operator).
//
// SOAK_ORDERS (2000) and SOAK_KILLS (20) make it longer; SOAK_SEED repeats
// a run's plans and fault schedule (the exact moments still depend on the
// machine).
func TestSoak(t *testing.T) {
	t.Parallel()
	began := time.Now()
	nOrders := envInt(t, "SOAK_ORDERS", 2000)
	nKills := envInt(t, "SOAK_KILLS", 20)
	seed := seedFrom(t, "SOAK_SEED")
	rng := rand.New(rand.NewPCG(seed, 0x50a4))
	runID := strconv.FormatUint(seed%1_000_000, 36)

	broker := newBroker(t)
	odb, ndb := ordersDB(t), notifierDB(t)
	admin := adminPool(t)
	databases := []string{databaseName(t, odb.Pool), databaseName(t, ndb.Pool)}
	smtp := smtptest.Start(t)
	ordersAddr, notifierAddr := freeAddr(t), freeAddr(t)
	ordersBase, notifierMetrics := "http://"+ordersAddr, "http://"+notifierAddr+"/metrics"

	oenv := ordersEnv(odb, ordersAddr, broker)
	oenv["DATABASE_URL"] = withAppName(odb.URL, appOrders)
	oenv["RELAY_BACKOFF_CAP"] = "2s" // a row that failed during an outage is retried soon after it
	orders := newService(t, "orders", "orders", oenv, ordersBase+"/readyz", "serve")
	notifier := newService(t, "notifier", "notifier",
		notifierEnv(ndb, notifierAddr, broker, smtp.Addr, ordersBase, "notifier-soak"),
		"http://"+notifierAddr+"/readyz", "serve")

	// The whole load must finish within this budget, restarts included;
	// a hang fails here rather than at the package timeout.
	budget := max(4*time.Minute, time.Duration(nOrders)*120*time.Millisecond)
	ctx, cancel := context.WithTimeout(context.Background(), budget)
	defer cancel()
	require.NoError(t, orders.start(ctx))
	require.NoError(t, notifier.start(ctx))

	schedule := soakSchedule(rng, nOrders, nKills, max(5, nKills/4))
	t.Logf("schedule (fault@completed orders): %v", schedule)
	drv := newDriver(newOrdersClient(ordersBase), runID)
	var (
		chaosErrs      errorList
		dupsBeforeKill float64 // inbox_duplicates_total of notifier incarnations, read just before each kill
		terminated     int
		rounds         int
	)
	chaosDone := make(chan struct{})
	go func() {
		defer close(chaosDone)
		for _, s := range schedule {
			if err := drv.waitCompleted(ctx, s.at); err != nil {
				return // the load failed or ran out of time; it reports why
			}
			var err error
			switch s.what {
			case "orders":
				if err = orders.kill(); err == nil {
					err = orders.start(ctx)
				}
			case "notifier":
				// Counters live in the process: read them before it dies.
				if d, serr := scrapeMetric(notifierMetrics, "inbox_duplicates_total"); serr == nil {
					dupsBeforeKill += d
				}
				if err = notifier.kill(); err == nil {
					err = notifier.start(ctx)
				}
			case "terminate":
				var n int
				n, err = terminateBackends(ctx, admin, databases, []string{appOrders, appNotifier})
				terminated += n
				rounds++
			}
			if err != nil {
				chaosErrs.add(fmt.Errorf("chaos step %s at %d orders: %w", s.what, s.at, err))
				cancel()
				return
			}
		}
	}()
	loadErr := drv.run(ctx, nOrders, 8, seed)
	if loadErr != nil {
		cancel() // stop the chaos, which may wait for progress that never comes
	}
	<-chaosDone
	require.NoError(t, chaosErrs.err())
	require.NoError(t, loadErr)
	loadTime := time.Since(began)
	ordersStarts, ordersKills := orders.counts()
	notifierStarts, notifierKills := notifier.counts()
	require.Equal(t, nKills, ordersKills+notifierKills, "every scheduled kill happened")
	t.Logf("load done in %s: %d orders; clients: %s", loadTime.Round(time.Millisecond), nOrders, &drv.stats)
	// A terminated database session answers 503 with Retry-After before
	// the commit and commit-unknown during it; never a bare 500.
	if n := drv.stats.unexplained.Load(); n > 0 {
		t.Errorf("%d server errors were neither unavailable (503) nor commit-unknown, e.g. %s", n, *drv.stats.sampleUnexplained.Load())
	}

	// Convergence: generous timeouts, because the last kills may have left
	// leases (RELAY_LEASE) and sends (EMAIL_SENDING_TIMEOUT) to expire.
	settle := time.Now()
	waitNoPending(t, odb.Pool, 3*time.Minute)
	events := outboxEvents(t, odb.Pool)
	want := map[uuid.UUID]bool{}
	byType := map[string]int{}
	emailing := 0
	for _, e := range events {
		require.Equal(t, "delivered", e.state, "event %s (%s v%d) is %s", e.eventID, e.eventType, e.version, e.state)
		want[e.eventID] = true
		byType[e.eventType]++
		if emailingTypes[e.eventType] {
			emailing++
		}
	}
	waitFor(t, 3*time.Minute, 250*time.Millisecond, "the notifier processes every event and finishes every email", func() (bool, string) {
		var processed, open, ledger int
		c := context.Background()
		ok := ndb.Pool.QueryRow(c, "SELECT count(*) FROM processed_event").Scan(&processed) == nil &&
			ndb.Pool.QueryRow(c, "SELECT count(*) FROM email_send").Scan(&ledger) == nil &&
			ndb.Pool.QueryRow(c, "SELECT count(*) FROM email_send WHERE state IN ('pending', 'sending')").Scan(&open) == nil
		return ok && processed >= len(events) && ledger >= emailing && open == 0,
			fmt.Sprintf("%d of %d events processed, %d of %d ledger rows, %d not finished", processed, len(events), ledger, emailing, open)
	})
	settleTime := time.Since(settle)

	// 1. Orders: one per idempotency key, each at the end of its plan, its
	// events numbered 1..version, and every confirmed answer backed by the
	// event it announced.
	orderByID := checkSoakOrders(t, odb.Pool, drv, seed, nOrders, events)

	// 2. The topic: every event, identity and payload unchanged, first
	// copies in version order per aggregate.
	records := readTopicToEnd(t, broker)
	copies := checkTopicAgainstOutbox(t, records, events, want)
	lateCopies := checkAggregateOrder(t, records)

	// 3. The notifier: each event applied exactly once, in order (no gap,
	// conflict, hold or park could arise from redelivery alone), and the
	// projection equal to the orders.
	checkAppliedOnce(t, ndb.Pool, events)
	checkProjection(t, ndb.Pool, orderByID)

	// 4. Email: one ledger row per emailing event; no Message-ID twice;
	// sent means delivered once to the order's address.
	sent, unknown := checkEmails(t, ndb.Pool, smtp, events, orderByID)
	require.LessOrEqual(t, len(unknown), notifierKills,
		"an unknown send needs a notifier killed during it: %d unknown, %d notifier kills", len(unknown), notifierKills)
	for _, u := range unknown {
		t.Logf("unknown email (a kill cut its send short; held for an operator): %s", u)
	}

	dupsNow, err := scrapeMetric(notifierMetrics, "inbox_duplicates_total")
	require.NoError(t, err)
	t.Logf("soak seed %d: %d orders, %d events %v, %d emailing", seed, nOrders, len(events), byType, emailing)
	t.Logf("topic: %d records, %d re-sends (%d events sent more than once), %d later copies of an older version",
		len(records), len(records)-len(copies), countOver(copies, 1), lateCopies)
	t.Logf("faults: %d kills (orders %d, notifier %d), restarts: orders %d, notifier %d; %d rounds of pg_terminate_backend ended %d sessions",
		ordersKills+notifierKills, ordersKills, notifierKills, ordersStarts-1, notifierStarts-1, rounds, terminated)
	t.Logf("notifier: inbox_duplicates_total %v at least (summed over incarnations, read before each kill); emails: %d sent, %d unknown, %d at the SMTP server",
		dupsBeforeKill+dupsNow, sent, len(unknown), len(smtp.Received()))
	t.Logf("time: load %s, convergence %s, total %s",
		loadTime.Round(time.Millisecond), settleTime.Round(time.Millisecond), time.Since(began).Round(time.Millisecond))
}

func countOver(m map[uuid.UUID]int, n int) int {
	c := 0
	for _, v := range m {
		if v > n {
			c++
		}
	}
	return c
}

// soakOrder is an order as the orders database holds it.
type soakOrder struct {
	email, status string
	version       int64
}

var soakEmailRE = regexp.MustCompile(`^o(\d+)-`)

// checkSoakOrders reconciles the clients' view with the database, which
// is the truth: one order per idempotency key (so per email address), each
// at the end of its plan, with events numbered 1..version, and every answer
// a client got backed by the event it announced. It returns the orders by
// id.
func checkSoakOrders(t *testing.T, pool *pgxpool.Pool, drv *driver, seed uint64, nOrders int, events []outboxEvent) map[string]soakOrder {
	t.Helper()
	rows, err := pool.Query(context.Background(), "SELECT id::text, email, status, version FROM orders")
	require.NoError(t, err)
	orders := map[string]soakOrder{}
	seen := map[int]bool{}
	for rows.Next() {
		var id string
		var o soakOrder
		require.NoError(t, rows.Scan(&id, &o.email, &o.status, &o.version))
		m := soakEmailRE.FindStringSubmatch(o.email)
		require.NotNil(t, m, "order %s has an email no client sent: %s", id, o.email)
		n, _ := strconv.Atoi(m[1])
		require.False(t, seen[n], "order %d was created twice (%s): its Idempotency-Key did not hold", n, o.email)
		seen[n] = true
		p := pickPlan(seed, n)
		wantStatus := "placed"
		if len(p) > 0 {
			wantStatus = statusAfter[p[len(p)-1]]
		}
		require.Equal(t, wantStatus, o.status, "order %d (%s), plan %s", n, id, p)
		orders[id] = o
	}
	require.NoError(t, rows.Err())
	require.Len(t, orders, nOrders, "one order per driven order")

	byOrder := map[string][]outboxEvent{}
	for _, e := range events { // sorted by aggregate, version
		_, ok := orders[e.aggregateID]
		require.True(t, ok, "event %s belongs to no order: %s", e.eventID, e.aggregateID)
		byOrder[e.aggregateID] = append(byOrder[e.aggregateID], e)
	}
	for id, o := range orders {
		evs := byOrder[id]
		require.Len(t, evs, int(o.version), "order %s at v%d", id, o.version)
		for i, e := range evs {
			require.Equal(t, int64(i+1), e.version, "order %s: versions are consecutive from 1", id)
		}
	}

	confirmed := drv.confirmations()
	commands := 0 // each order ran its create and every command of its plan exactly once
	for n := range nOrders {
		commands += 1 + len(pickPlan(seed, n))
	}
	for _, c := range confirmed {
		o, ok := orders[c.orderID]
		require.True(t, ok, "a %s of %s was confirmed but the order does not exist", c.command, c.orderID)
		require.LessOrEqual(t, c.version, o.version, "%s of %s confirmed v%d", c.command, c.orderID, c.version)
		e := byOrder[c.orderID][c.version-1]
		switch c.command {
		case "create":
			require.Equal(t, "order.placed", e.eventType)
		case "pay":
			require.Equal(t, "order.paid", e.eventType)
		case "ship":
			require.Equal(t, "order.shipped", e.eventType)
		case "cancel":
			require.Contains(t, []string{"order.cancelled", "order.refund_requested"}, e.eventType)
		}
	}
	t.Logf("%d commands committed, %d confirmed to a client: %d answers were lost (the database, not the client, says what happened)",
		commands, len(confirmed), commands-len(confirmed))
	return orders
}

// checkAppliedOnce checks the inbox: one processed_event row per event,
// each applied (redelivery alone never opens a gap or a conflict), and
// nothing held, conflicting or parked.
func checkAppliedOnce(t *testing.T, pool *pgxpool.Pool, events []outboxEvent) {
	t.Helper()
	ctx := context.Background()
	rows, err := pool.Query(ctx, "SELECT event_id, aggregate_id, aggregate_version, event_type, outcome FROM processed_event")
	require.NoError(t, err)
	type marker struct {
		aggregateID, eventType, outcome string
		version                         int64
	}
	markers := map[uuid.UUID]marker{}
	for rows.Next() {
		var id uuid.UUID
		var m marker
		require.NoError(t, rows.Scan(&id, &m.aggregateID, &m.version, &m.eventType, &m.outcome))
		markers[id] = m
	}
	require.NoError(t, rows.Err())
	require.Len(t, markers, len(events), "processed_event: one row per event")
	for _, e := range events {
		m, ok := markers[e.eventID]
		require.True(t, ok, "event %s (%s v%d) never reached the inbox", e.eventID, e.eventType, e.version)
		require.Equal(t, marker{e.aggregateID, e.eventType, "applied", e.version}, m, "inbox row of %s", e.eventID)
	}
	for _, table := range []string{"inbox_held_event", "inbox_conflict", "inbox_parked_record"} {
		var n int
		require.NoError(t, pool.QueryRow(ctx, "SELECT count(*) FROM "+table).Scan(&n))
		require.Zero(t, n, "%s is empty", table)
	}
}

// checkProjection checks that the notifier's view of every order is the
// orders database's: same status, email and version.
func checkProjection(t *testing.T, pool *pgxpool.Pool, orders map[string]soakOrder) {
	t.Helper()
	rows, err := pool.Query(context.Background(), "SELECT order_id::text, email, status, version FROM order_projection")
	require.NoError(t, err)
	n := 0
	for rows.Next() {
		var id string
		var p soakOrder
		require.NoError(t, rows.Scan(&id, &p.email, &p.status, &p.version))
		o, ok := orders[id]
		require.True(t, ok, "projection of an order that does not exist: %s", id)
		require.Equal(t, o, p, "projection of %s", id)
		n++
	}
	require.NoError(t, rows.Err())
	require.Equal(t, len(orders), n, "every order is projected")
}

// checkEmails checks the send ledger against the SMTP server: one ledger
// row per emailing event and none for order.refund_requested; no
// Message-ID received twice, none that no event asked for; a sent row was
// received exactly once, at its order's address. It returns how many were
// sent and a description of each unknown row.
func checkEmails(t *testing.T, pool *pgxpool.Pool, smtp *smtptest.Server, events []outboxEvent, orders map[string]soakOrder) (sent int, unknown []string) {
	t.Helper()
	received := map[string][]smtptest.Message{}
	for _, m := range smtp.Received() {
		received[m.MessageID] = append(received[m.MessageID], m)
	}
	for mid, ms := range received {
		require.Equal(t, 1, len(ms), "Message-ID %s reached the SMTP server %d times", mid, len(ms))
	}
	type ledgerRow struct{ state, recipient, errorClass string }
	rows, err := pool.Query(context.Background(),
		"SELECT event_id, state, recipient, coalesce(last_error_class, '') FROM email_send")
	require.NoError(t, err)
	ledger := map[uuid.UUID]ledgerRow{}
	for rows.Next() {
		var id uuid.UUID
		var r ledgerRow
		require.NoError(t, rows.Scan(&id, &r.state, &r.recipient, &r.errorClass))
		ledger[id] = r
	}
	require.NoError(t, rows.Err())

	emailing := 0
	for _, e := range events {
		r, ok := ledger[e.eventID]
		if !emailingTypes[e.eventType] {
			require.False(t, ok, "%s %s sends no email but has a ledger row", e.eventType, e.eventID)
			continue
		}
		emailing++
		require.True(t, ok, "%s %s has no ledger row", e.eventType, e.eventID)
		o := orders[e.aggregateID]
		require.Equal(t, o.email, r.recipient, "recipient of %s", e.eventID)
		mid := notify.MessageID(e.eventID)
		msgs := received[mid]
		delete(received, mid)
		switch r.state {
		case "sent":
			require.Equal(t, 1, len(msgs), "sent email %s of %s %s was received once", mid, e.eventType, e.aggregateID)
			require.Equal(t, []string{o.email}, msgs[0].To, "email %s went to its order's address", mid)
			sent++
		case "unknown":
			unknown = append(unknown, fmt.Sprintf("%s of order %s (%s, %d copies at the SMTP server)", e.eventType, e.aggregateID, r.errorClass, len(msgs)))
		default:
			require.Failf(t, "email not finished", "%s %s: ledger row %s (%s)", e.eventType, e.eventID, r.state, r.errorClass)
		}
	}
	require.Len(t, ledger, emailing, "one ledger row per emailing event")
	require.Empty(t, received, "emails whose Message-ID belongs to no emailing event")
	return sent, unknown
}
