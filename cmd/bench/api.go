package main

import (
	"bytes"
	"context"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"runtime"
	"sort"
	"strconv"
	"time"
)

// uuidV7SQL makes a time-ordered id like the service's UUIDv7: 48 bits of
// Unix milliseconds, then random bits (version and variant bits are not
// set; the index sees the same order).
const uuidV7SQL = `(lpad(to_hex((extract(epoch FROM clock_timestamp()) * 1000)::bigint), 12, '0') || substr(md5(random()::text), 1, 20))::uuid`

// pgbenchScript is the transaction of POST /orders as the service runs it
// (internal/orders Place, db/queries/orders.sql, the outbox's OutboxInsert):
// the order, its one line and the order.placed outbox row, each statement
// one round trip, in one transaction.
const pgbenchScript = `BEGIN;
INSERT INTO orders (id, customer, email, currency, status, total_cents, version, created_at, updated_at)
VALUES (` + uuidV7SQL + `, 'bench', 'bench@example.com', 'EUR', 'placed', 2500, 1, now(), now())
RETURNING id AS order_id, created_at AS placed_at \gset
INSERT INTO order_lines (order_id, line_no, sku, quantity, unit_price_cents)
SELECT :order_id::uuid, unnest(ARRAY[1]::integer[]), unnest(ARRAY['BOOK-1']::text[]),
       unnest(ARRAY[2]::integer[]), unnest(ARRAY[1250]::bigint[])
RETURNING *;
INSERT INTO outbox (event_id, aggregate_type, aggregate_id, aggregate_version,
                    event_type, schema_version, payload, traceparent, tracestate,
                    publish_mode, state, delivered_at)
SELECT e.event_id, e.aggregate_type, e.aggregate_id, e.aggregate_version,
       e.event_type, e.schema_version, e.payload, nullif(e.traceparent, ''), nullif(e.tracestate, ''),
       coalesce(m.mode, 'outbox'),
       CASE WHEN m.mode = 'direct' THEN 'delivered' ELSE 'pending' END,
       CASE WHEN m.mode = 'direct' THEN clock_timestamp() END
FROM (SELECT ` + uuidV7SQL + ` AS event_id, 'order'::text AS aggregate_type, :order_id::text AS aggregate_id,
             1::bigint AS aggregate_version, 'order.placed'::text AS event_type, 1 AS schema_version,
             jsonb_build_object('order_id', :order_id::text, 'customer', 'bench', 'email', 'bench@example.com',
                 'currency', 'EUR', 'items', jsonb_build_array(jsonb_build_object('sku', 'BOOK-1', 'quantity', 2, 'unit_price_cents', 1250)),
                 'total_cents', 2500, 'placed_at', :placed_at::timestamptz) AS payload,
             ''::text AS traceparent, ''::text AS tracestate) e
LEFT JOIN outbox_publish_mode m ON m.event_type = e.event_type
RETURNING event_id, publish_mode, created_at;
COMMIT;
`

// ordersServe starts `orders serve` on db with the relay on or off and
// waits until it is ready. It returns the process and its base URL.
func (b *bench) ordersServe(ctx context.Context, name, db, broker string, relay bool) (*proc, string, error) {
	addr, err := freeAddr()
	if err != nil {
		return nil, "", err
	}
	env := map[string]string{
		"DATABASE_URL":  b.dbURL(db),
		"HTTP_ADDR":     addr,
		"AUTH_TOKENS":   authTokens,
		"KAFKA_BROKERS": broker,
		"ORDERS_TOPIC":  topic,
		"RELAY_ENABLED": strconv.FormatBool(relay),
	}
	if b.opts.RelayBatch > 0 {
		env["RELAY_BATCH_SIZE"] = strconv.Itoa(b.opts.RelayBatch)
	}
	p, err := b.start(name, b.bins["orders"], env, "serve")
	if err != nil {
		return nil, "", err
	}
	base := "http://" + addr
	return p, base, p.waitHTTP(ctx, base+"/readyz")
}

// apiRun measures POST /orders on a fresh database, closed loop from
// -conns connections, reporting the processes' peak RSS under sc.
func (b *bench) apiRun(ctx context.Context, sc string, relay bool) (loadResult, error) {
	db, err := b.ordersDB(ctx, "api")
	if err != nil {
		return loadResult{}, err
	}
	broker, addr, err := b.startBroker(ctx)
	if err != nil {
		return loadResult{}, err
	}
	name := "orders serve (relay off)"
	if relay {
		name = "orders serve (relay on)"
	}
	srv, base, err := b.ordersServe(ctx, name, db, addr, relay)
	if err != nil {
		return loadResult{}, err
	}
	meter := startCPU(map[string]int{"orders serve": srv.pid(), "devbroker": broker.pid(), "bench (load)": selfPID()}, b.runID)
	res, err := b.closedLoad(ctx, meter, base, b.opts.Conns, b.opts.APIDuration)
	if err != nil {
		return res, err
	}
	res.CPU = meter.stop()
	b.rep.LoadTool = res.Tool
	if err := srv.check(); err != nil {
		return res, err
	}
	if res.OK == 0 {
		return res, fmt.Errorf("%s: no order was created (%d failures); end of its log:\n%s", name, res.Other, tail(srv.logPath, 10))
	}
	b.logf("%s: %d orders in %s (%d failed requests); %s", name, res.OK, res.Duration.Round(time.Millisecond), res.Other, res.CPU)
	if err := b.stopProc(sc, srv); err != nil {
		return res, err
	}
	return res, b.stopProc(sc, broker)
}

// pgbenchRun runs the POST /orders transaction with pgbench on a fresh
// database and returns its transactions per second.
func (b *bench) pgbenchRun(ctx context.Context) (float64, cores, error) {
	db, err := b.ordersDB(ctx, "pgbench")
	if err != nil {
		return 0, cores{}, err
	}
	script := filepath.Join(b.dir, "post-order.sql")
	if err := os.WriteFile(script, []byte(pgbenchScript), 0o644); err != nil {
		return 0, cores{}, err
	}
	pgbench, err := exec.LookPath("pgbench")
	if err != nil {
		return 0, cores{}, fmt.Errorf("pgbench not found (Debian: postgresql-client): %w", err)
	}
	secs := max(1, int(b.opts.APIDuration.Seconds()))
	cmd := exec.CommandContext(ctx, pgbench, "-n", "-M", "prepared", "-c", strconv.Itoa(b.opts.Conns),
		"-j", strconv.Itoa(min(2, b.opts.Conns)), "-T", strconv.Itoa(secs), "-f", script, b.dbURL(db))
	var out bytes.Buffer
	cmd.Stdout, cmd.Stderr = &out, &out
	if err := cmd.Start(); err != nil {
		return 0, cores{}, fmt.Errorf("pgbench: %w", err)
	}
	meter := startCPU(map[string]int{"pgbench": cmd.Process.Pid}, b.runID)
	// pgbench runs for secs after connecting: sample its ticks while it is
	// still there (they are gone once it is reaped).
	time.Sleep(b.opts.APIDuration)
	used := meter.stop()
	if err := cmd.Wait(); err != nil {
		return 0, used, fmt.Errorf("pgbench: %w\n%s", err, out.Bytes())
	}
	tps, err := pgbenchTPS(out.Bytes())
	if err == nil {
		b.logf("pgbench: %.0f transactions/s over %ds; %s", tps, secs, used)
	}
	return tps, used, err
}

// apiScenario compares POST /orders with the relay on and off against
// pgbench running the same transaction.
func (b *bench) apiScenario(ctx context.Context) error {
	const sc = "api"
	on, err := b.apiRun(ctx, sc, true)
	if err != nil {
		return err
	}
	off, err := b.apiRun(ctx, sc, false)
	if err != nil {
		return err
	}
	tps, pgCPU, err := b.pgbenchRun(ctx)
	if err != nil {
		return err
	}
	ref := fmt.Sprintf("pgbench -c%d -j%d", b.opts.Conns, min(2, b.opts.Conns))
	b.rep.add(result{Scenario: sc, Figure: "POST /orders, relay on", Value: on.rate(), Unit: "orders/s",
		Reference: ref, RefValue: tps, Target: "ratio >= 0.8",
		Note: fmt.Sprintf("%s for %s per run, fresh database each; pgbench runs the service's transaction (order, one line, one outbox row) with -M prepared; the service uses its default pool size", on.Tool, b.opts.APIDuration)})
	b.rep.add(result{Scenario: sc, Figure: "POST /orders, relay off", Value: off.rate(), Unit: "orders/s",
		Reference: ref, RefValue: tps, Target: "-"})
	b.rep.add(result{Scenario: sc, Figure: "relay on / relay off", Value: on.rate(), Unit: "orders/s",
		Reference: "relay off", RefValue: off.rate(), Target: "-"})
	// Where the CPU went: on a machine whose cores are all busy, the
	// service's own share (and the broker's, with the relay on) is what
	// pgbench does not pay.
	for _, run := range []struct {
		name string
		c    cores
	}{{"relay on", on.CPU}, {"relay off", off.CPU}, {"pgbench", pgCPU}} {
		b.rep.add(result{Scenario: sc, Figure: "cores busy, " + run.name, Value: run.c.Machine, Unit: "cores",
			Reference: "cores", RefValue: float64(runtime.NumCPU()), Target: "-", Note: run.c.String()})
		b.addCores(sc, run.name+": ", run.c)
	}
	return nil
}

// addCores reports each process's cores of a measurement against the
// cores the whole machine kept busy meanwhile: the ratio is its share.
func (b *bench) addCores(sc, prefix string, c cores) {
	names := make([]string, 0, len(c.Procs))
	for name := range c.Procs {
		names = append(names, name)
	}
	sort.Strings(names)
	for _, name := range names {
		b.rep.add(result{Scenario: sc, Figure: prefix + "cores, " + name, Value: c.Procs[name], Unit: "cores",
			Reference: "machine busy", RefValue: c.Machine})
	}
}
