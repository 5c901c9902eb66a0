package e2e

import (
	"bytes"
	"context"
	"fmt"
	"net/http"
	"os/exec"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/google/uuid"
	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/stretchr/testify/require"

	"github.com/outboxref/orders/internal/notify"
	"github.com/outboxref/orders/internal/notify/smtptest"
	"github.com/outboxref/orders/internal/pgtest"
)

// conflictReport is the query docs/runbook.md gives operators to compare
// each conflicting event with the event that owns its version, and to see
// what became of its email.
const conflictReport = `SELECT c.aggregate_id, c.aggregate_version, c.event_type, c.event_id,
       p.event_type AS existing_type, c.existing_event_id, c.resolution,
       e.state AS email_state, e.skip_reason
FROM inbox_conflict c
JOIN processed_event p ON p.event_id = c.existing_event_id
LEFT JOIN email_send e ON e.event_id = c.event_id
ORDER BY c.detected_at`

// TestDisasterRecovery (V5) restores the orders database from a backup
// while the broker and the notifier hold newer history, following the
// procedure of docs/runbook.md ("Restoring the orders database from a
// backup") with the same commands.
//
//   - Before the backup: orders a1..a4 are created, a1 and a2 paid, all
//     delivered. Then the relay is stopped, so that the backup holds
//     undelivered events, as a backup taken under load does: b1 and b2 are
//     created and a4 paid (three pending rows). pg_dump.
//   - After the backup: the relay delivers those three; a2 is shipped, a3
//     cancelled (v2), a4 cancelled (v3 and the refund request v4), c1
//     created. The notifier applies and emails all of it.
//   - Restore: stop orders, drop and recreate the database, pg_restore,
//     orders migrate, start orders. The relay publishes the three pending
//     events again: the notifier absorbs them as duplicates.
//   - On the restored state: paying a3 writes v2 and shipping a4 writes v3,
//     versions the notifier already has from other events: two conflicts,
//     recorded and counted. The orders API says it wrote the new events
//     (C7): each order is resynchronised from it and the new event's email
//     is sent once. Paying b2 and creating d1 are new versions and are
//     applied and emailed normally.
//
// No email is sent twice.
func TestDisasterRecovery(t *testing.T) {
	t.Parallel()
	began := time.Now()
	broker := newBroker(t)
	odb, ndb := ordersDB(t), notifierDB(t)
	smtp := smtptest.Start(t)
	apiAddr, relayAddr, notifierAddr := freeAddr(t), freeAddr(t), freeAddr(t)
	base, notifierMetrics := "http://"+apiAddr, "http://"+notifierAddr+"/metrics"

	// The API and the relay run as separate processes so that the relay
	// can be stopped while commands go on.
	apiEnv := ordersEnv(odb, apiAddr, broker)
	apiEnv["RELAY_ENABLED"] = "false"
	relayEnv := ordersEnv(odb, apiAddr, broker)
	relayEnv["RELAY_METRICS_ADDR"] = relayAddr
	ordersAPI := newService(t, "orders", "orders", apiEnv, base+"/readyz", "serve")
	relay := newService(t, "orders-relay", "orders", relayEnv, "http://"+relayAddr+"/readyz", "relay")
	notifier := newService(t, "notifier", "notifier",
		notifierEnv(ndb, notifierAddr, broker, smtp.Addr, base, "notifier-dr"), "http://"+notifierAddr+"/readyz", "serve")
	ctx, cancel := context.WithTimeout(context.Background(), 3*time.Minute)
	defer cancel()
	for _, s := range []*service{ordersAPI, relay, notifier} {
		require.NoError(t, s.start(ctx))
	}

	hc := &http.Client{Timeout: 10 * time.Second}
	alice, ops := api{base: base, token: "dev-alice", http: hc}, api{base: base, token: "dev-ops", http: hc}
	create := func(name string) string {
		t.Helper()
		status, body, err := alice.call("POST", "/orders", "", newOrder("dr-"+name+"@example.com"))
		require.NoError(t, err)
		require.Equal(t, http.StatusCreated, status, "create %s: %v", name, body)
		return body["id"].(string)
	}
	command := func(as api, id, cmd string, version int64) int64 {
		t.Helper()
		status, body, err := as.call("POST", "/orders/"+id+"/"+cmd, `"`+strconv.FormatInt(version, 10)+`"`, nil)
		require.NoError(t, err)
		require.Equal(t, http.StatusOK, status, "%s %s at v%d: %v", cmd, id, version, body)
		return int64(body["version"].(float64))
	}
	// caughtUp waits until the relay delivered everything and the notifier
	// processed it and finished its emails.
	caughtUp := func(what string) {
		t.Helper()
		waitNoPending(t, odb.Pool, time.Minute)
		ids := eventIDs(outboxEvents(t, odb.Pool))
		waitFor(t, time.Minute, 100*time.Millisecond, what+": the notifier catches up", func() (bool, string) {
			var missing, open int
			c := context.Background()
			ok := ndb.Pool.QueryRow(c, "SELECT count(*) FROM unnest($1::uuid[]) id WHERE NOT EXISTS (SELECT 1 FROM processed_event p WHERE p.event_id = id)", ids).Scan(&missing) == nil &&
				ndb.Pool.QueryRow(c, "SELECT count(*) FROM email_send WHERE state IN ('pending', 'sending')").Scan(&open) == nil
			return ok && missing == 0 && open == 0,
				fmt.Sprintf("%d of %d events not in processed_event, %d emails not finished", missing, len(ids), open)
		})
	}

	// Before the backup.
	a1, a2, a3, a4 := create("a1"), create("a2"), create("a3"), create("a4")
	command(alice, a1, "pay", 1)
	command(alice, a2, "pay", 1)
	caughtUp("before the backup")
	relay.stop()
	b1, b2 := create("b1"), create("b2")
	command(alice, a4, "pay", 1)
	pendingAtBackup := map[uuid.UUID]bool{}
	for _, e := range outboxEvents(t, odb.Pool) {
		if e.state == "pending" {
			pendingAtBackup[e.eventID] = true
		}
	}
	require.Len(t, pendingAtBackup, 3, "b1 and b2 placed and a4 paid wait for the relay")

	dump := filepath.Join(t.TempDir(), "orders.dump")
	runCmd(t, nil, "pg_dump", "--format=custom", "--file="+dump, "--dbname="+odb.URL)

	// After the backup: history the restore will lose, but the broker and
	// the notifier keep.
	require.NoError(t, relay.start(ctx))
	command(ops, a2, "ship", 2)
	command(alice, a3, "cancel", 1)
	require.Equal(t, int64(4), command(alice, a4, "cancel", 2))
	c1 := create("c1")
	caughtUp("after the backup")
	history := outboxEvents(t, odb.Pool)
	dupsBefore, err := scrapeMetric(notifierMetrics, "inbox_duplicates_total")
	require.NoError(t, err)
	emailsBefore := len(smtp.Received())

	// The restore, as docs/runbook.md shows it.
	restoreStarted := time.Now()
	ordersAPI.stop()
	relay.stop()
	name := databaseName(t, odb.Pool)
	runCmd(t, nil, "dropdb", "--maintenance-db="+pgtest.ServerURL(), "--force", name)
	runCmd(t, nil, "createdb", "--maintenance-db="+pgtest.ServerURL(), name)
	runCmd(t, nil, "pg_restore", "--dbname="+odb.URL, "--no-owner", "--exit-on-error", dump)
	runCmd(t, []string{"DATABASE_URL=" + odb.URL}, filepath.Join(binDir, "orders"), "migrate")
	odb.Pool.Reset() // its connections went with the dropped database
	changed := changedAfterBackup(t, ndb.URL, odb.URL)
	require.Equal(t, map[string]string{a2: "3|2", a3: "2|1", a4: "4|2", c1: "1|"}, changed,
		"the runbook's comparison lists the orders changed after the backup (notifier version|orders version)")
	restored := map[uuid.UUID]bool{}
	for _, e := range outboxEvents(t, odb.Pool) {
		restored[e.eventID] = true
		require.Equal(t, pendingAtBackup[e.eventID], e.state == "pending", "event %s is as it was at backup time", e.eventID)
	}
	require.NoError(t, ordersAPI.start(ctx))
	require.NoError(t, relay.start(ctx))
	restoreTime := time.Since(restoreStarted)

	// The restored database has forgotten what happened after the backup.
	status, _, err := alice.call("GET", "/orders/"+c1, "", nil)
	require.NoError(t, err)
	require.Equal(t, http.StatusNotFound, status, "c1 was created after the backup")

	// New commands on the restored state.
	require.Equal(t, int64(2), command(alice, a3, "pay", 1)) // the notifier has v2 of a3: order.cancelled
	require.Equal(t, int64(3), command(ops, a3, "ship", 2))  // a later version of a forked order
	require.Equal(t, int64(3), command(ops, a4, "ship", 2))  // the notifier has v3 of a4: order.cancelled
	require.Equal(t, int64(2), command(alice, b2, "pay", 1)) // new to the notifier
	d1 := create("d1")
	caughtUp("after the restore")
	var conflicts float64
	waitFor(t, time.Minute, 100*time.Millisecond, "the notifier counts two conflicts", func() (bool, string) {
		conflicts, err = scrapeMetric(notifierMetrics, "inbox_conflicts_total")
		return err == nil && conflicts >= 2, fmt.Sprintf("inbox_conflicts_total %v (error: %v)", conflicts, err)
	})

	// A conflict means the order's history forked: the notifier resyncs
	// each such order from the orders API, and its later events wait for
	// that instead of landing on top of the lost history.
	waitFor(t, time.Minute, 100*time.Millisecond, "the notifier follows the restored orders", func() (bool, string) {
		var got []string
		for _, id := range []string{a3, a4} {
			var status string
			var version int64
			if err := ndb.Pool.QueryRow(ctx, "SELECT status, version FROM order_projection WHERE order_id = $1", id).Scan(&status, &version); err != nil {
				return false, err.Error()
			}
			got = append(got, fmt.Sprintf("%s v%d", status, version))
		}
		return slices.Equal(got, []string{"shipped v3", "shipped v3"}), fmt.Sprintf("a3, a4: %v", got)
	})

	// Which events the test expects where.
	after := outboxEvents(t, odb.Pool)
	all := map[uuid.UUID]outboxEvent{}
	for _, e := range append(history, after...) {
		all[e.eventID] = e
	}
	find := func(events []outboxEvent, aggregate string, version int64) outboxEvent {
		t.Helper()
		for _, e := range events {
			if e.aggregateID == aggregate && e.version == version {
				return e
			}
		}
		require.Failf(t, "no such event", "%s v%d", aggregate, version)
		return outboxEvent{}
	}
	conflicting := map[uuid.UUID]uuid.UUID{ // new event -> the event that owns its version
		find(after, a3, 2).eventID: find(history, a3, 2).eventID,
		find(after, a4, 3).eventID: find(history, a4, 3).eventID,
	}
	require.Equal(t, "order.paid", all[find(after, a3, 2).eventID].eventType)
	require.Equal(t, "order.cancelled", all[find(history, a3, 2).eventID].eventType)

	// 1. The re-published events are on the topic twice and were absorbed:
	// every copy beyond the first of each event was counted as a duplicate.
	records := readTopicToEnd(t, broker)
	copies := map[uuid.UUID]int{}
	for _, rec := range records {
		id := uuid.MustParse(rec.headers["ce_id"])
		_, known := all[id]
		require.True(t, known, "the topic holds an event neither outbox had: %s", id)
		copies[id]++
	}
	for id := range pendingAtBackup {
		require.GreaterOrEqual(t, copies[id], 2, "%s was published before the restore and again after it", all[id].eventType)
	}
	for id, e := range all {
		require.Positive(t, copies[id], "%s v%d of %s is on the topic", e.eventType, e.version, e.aggregateID)
	}
	dups, err := scrapeMetric(notifierMetrics, "inbox_duplicates_total")
	require.NoError(t, err)
	require.Equal(t, float64(len(records)-len(copies)), dups, "every extra copy on the topic is one duplicate")
	require.GreaterOrEqual(t, dups-dupsBefore, float64(len(pendingAtBackup)))

	// 2. Conflicts: counted, recorded next to the event that owns the
	// version, and settled by the orders API: the new events are its own,
	// so their emails are sent (checked in 4).
	require.Equal(t, float64(len(conflicting)), conflicts)
	type conflictRow struct {
		aggregate, eventType, existingType string
		version                            int64
		id, existing                       uuid.UUID
		resolution, emailState, skipReason *string
	}
	var report []conflictRow
	waitFor(t, 30*time.Second, 200*time.Millisecond, "the conflicts are settled and their emails sent", func() (bool, string) {
		rows, err := ndb.Pool.Query(ctx, conflictReport)
		if err != nil {
			return false, err.Error()
		}
		defer rows.Close()
		report = report[:0]
		settled := 0
		for rows.Next() {
			var r conflictRow
			if err := rows.Scan(&r.aggregate, &r.version, &r.eventType, &r.id, &r.existingType, &r.existing, &r.resolution, &r.emailState, &r.skipReason); err != nil {
				return false, err.Error()
			}
			report = append(report, r)
			if r.resolution != nil && *r.resolution == "genuine" && r.emailState != nil && *r.emailState == "sent" {
				settled++
			}
		}
		return rows.Err() == nil && settled == len(conflicting), fmt.Sprintf("%d of %d settled and sent", settled, len(conflicting))
	})
	for _, r := range report {
		require.Equal(t, conflicting[r.id], r.existing, "conflict of %s %s v%d", r.eventType, r.aggregate, r.version)
		require.Equal(t, "order.cancelled", r.existingType)
		require.Nil(t, r.skipReason)
		t.Logf("conflict: %s v%d of %s (%s) vs %s (%s): %s, email %s", r.eventType, r.version, r.aggregate, r.id, r.existingType, r.existing, *r.resolution, *r.emailState)
	}
	require.Len(t, report, len(conflicting))

	// 3. Every event reached the inbox once. Where the orders database
	// forgot history, the notifier kept it, except for the forked orders,
	// which now follow the orders database: the lost events there are
	// retired ("forked", still recognised as duplicates) and a3's ship
	// was held until the resync and covered by it, or arrived after a
	// resync that already held it, or after one that did not and applied.
	forked := map[uuid.UUID]bool{find(history, a3, 2).eventID: true, find(history, a4, 3).eventID: true, find(history, a4, 4).eventID: true}
	// An event that arrives for a version the resync's snapshot already
	// placed waits for the next resync to be vouched for by the orders API.
	waitFor(t, 30*time.Second, 100*time.Millisecond, "nothing is held any more", func() (bool, string) {
		var held int
		err := ndb.Pool.QueryRow(ctx, "SELECT count(*) FROM inbox_held_event WHERE state = 'held'").Scan(&held)
		return err == nil && held == 0, fmt.Sprintf("%d held (error: %v)", held, err)
	})
	outcomes := processedOutcomes(t, ndb.Pool)
	for id, e := range all {
		want := []string{"applied"}
		switch _, conflict := conflicting[id]; {
		case conflict:
			want = []string{"covered"} // the orders API's own: its effects ran once
		case forked[id]:
			want = []string{"forked"}
		case id == find(after, a3, 3).eventID:
			want = []string{"superseded", "covered", "applied"}
		}
		require.Contains(t, want, outcomes[id], "%s v%d of %s", e.eventType, e.version, e.aggregateID)
	}
	require.Len(t, outcomes, len(all), "no other event reached the inbox")
	for _, p := range []struct {
		id, status string
		version    int64
	}{
		{a1, "paid", 2},
		{a2, "shipped", 3}, // the restored order is paid, at v2
		{a3, "shipped", 3}, // forked: resynchronised from the restored order, then shipped
		{a4, "shipped", 3}, // forked: the lost history had cancelled it at v4
		{b1, "placed", 1},
		{b2, "paid", 2},
		{c1, "placed", 1}, // unknown to the restored orders database
		{d1, "placed", 1},
	} {
		var status string
		var version int64
		require.NoError(t, ndb.Pool.QueryRow(ctx, "SELECT status, version FROM order_projection WHERE order_id = $1", p.id).Scan(&status, &version))
		require.Equal(t, []any{p.status, p.version}, []any{status, version}, "projection of %s", p.id)
	}

	// 4. One email per emailing event, the conflicting ones included (the
	// orders API wrote them); none twice.
	received := map[string]int{}
	for _, m := range smtp.Received() {
		received[m.MessageID]++
	}
	emailing := 0
	for id, e := range all {
		if !emailingTypes[e.eventType] {
			continue
		}
		emailing++
		require.Equal(t, 1, received[notify.MessageID(id)], "emails for %s v%d of %s", e.eventType, e.version, e.aggregateID)
	}
	for mid, n := range received {
		require.Equal(t, 1, n, "Message-ID %s received %d times", mid, n)
	}
	require.Len(t, smtp.Received(), emailing)

	t.Logf("backup held %d events, %d of them pending; %d events were written after it and lost by the restore; %d written on the restored state",
		len(restored), len(pendingAtBackup), len(history)-len(restored), len(after)-len(restored))
	t.Logf("notifier: inbox_duplicates_total %v -> %v, inbox_conflicts_total %v; emails %d before the restore, %d after, %d in all, none twice",
		dupsBefore, dups, conflicts, emailsBefore, len(smtp.Received())-emailsBefore, len(smtp.Received()))
	t.Logf("time: restore (stop to ready) %s, total %s", restoreTime.Round(time.Millisecond), time.Since(began).Round(time.Millisecond))
}

// The runbook's comparison (step 4): which orders the notifier saw change
// after the backup, with the notifier's version and the restored one.
var (
	exportProjection = []string{"-X", "-q", "-At", "-c", "COPY (SELECT order_id, version FROM order_projection) TO STDOUT"}
	compareOrders    = []string{"-X", "-q", "-At",
		"-c", "CREATE TEMP TABLE projection (order_id uuid, version bigint)",
		"-c", "COPY projection FROM STDIN",
		"-c", "SELECT p.order_id, p.version, o.version FROM projection p LEFT JOIN orders o ON o.id = p.order_id " +
			"WHERE o.id IS NULL OR o.version < p.version ORDER BY p.order_id"}
)

// changedAfterBackup runs the runbook's pipeline
// `psql NOTIFIER -c COPY... | psql ORDERS -c ... -c COPY... -c SELECT...`
// and returns its lines as order id -> "notifier version|orders version".
func changedAfterBackup(t *testing.T, notifierURL, ordersURL string) map[string]string {
	t.Helper()
	export := exec.Command("psql", append([]string{notifierURL}, exportProjection...)...)
	projection, err := export.Output()
	require.NoError(t, err, "export the projection")
	compare := exec.Command("psql", append([]string{ordersURL}, compareOrders...)...)
	compare.Stdin = bytes.NewReader(projection)
	out, err := compare.CombinedOutput()
	require.NoError(t, err, "compare with the restored orders:\n%s", out)
	changed := map[string]string{}
	for _, line := range strings.Split(strings.TrimSpace(string(out)), "\n") {
		if id, versions, ok := strings.Cut(line, "|"); ok {
			changed[id] = versions
		}
	}
	return changed
}

func eventIDs(events []outboxEvent) []uuid.UUID {
	ids := make([]uuid.UUID, len(events))
	for i, e := range events {
		ids[i] = e.eventID
	}
	return ids
}

func processedOutcomes(t *testing.T, pool *pgxpool.Pool) map[uuid.UUID]string {
	t.Helper()
	rows, err := pool.Query(context.Background(), "SELECT event_id, outcome FROM processed_event")
	require.NoError(t, err)
	defer rows.Close()
	out := map[uuid.UUID]string{}
	for rows.Next() {
		var id uuid.UUID
		var outcome string
		require.NoError(t, rows.Scan(&id, &outcome))
		out[id] = outcome
	}
	require.NoError(t, rows.Err())
	return out
}

// runCmd runs one command of the runbook and fails the test with its
// output if it fails.
func runCmd(t *testing.T, env []string, name string, args ...string) {
	t.Helper()
	cmd := exec.Command(name, args...)
	if env != nil {
		cmd.Env = append(cmd.Environ(), env...)
	}
	out, err := cmd.CombinedOutput()
	require.NoError(t, err, "%s %s:\n%s", name, strings.Join(args, " "), out)
}
