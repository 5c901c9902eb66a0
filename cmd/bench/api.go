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

// pgbench runs the transaction of POST /orders (internal/orders Place,
// db/queries/orders.sql, the outbox's OutboxInsert) in two ways, both with
// -M prepared. pgbenchScript sends each statement in its own round trip
// inside BEGIN and COMMIT, five round trips per order. pgbenchPipelined
// sends the three statements as one pipeline outside any explicit
// transaction, one round trip that PostgreSQL runs as one implicit
// transaction, as the service does; the order's id is then made from the
// transaction's time and a random number, since a pipeline cannot read
// back the id of its first statement.
var (
	pgbenchScript = "BEGIN;\n" +
		postOrderStatements(uuidV7SQL, "RETURNING id AS order_id, created_at AS placed_at \\gset", ":order_id", ":placed_at::timestamptz") +
		"COMMIT;\n"
	pgbenchPipelined = "\\set r random(0, 4611686018427387903)\n\\startpipeline\n" +
		postOrderStatements(pipelinedOrderID, "RETURNING id, created_at;", pipelinedOrderID, "now()") +
		"\\endpipeline\n"
)

// pipelinedOrderID is the order's id in pgbenchPipelined: time-ordered
// like the service's UUIDv7, and the same in each statement of the
// pipeline, whose implicit transaction has one now().
const pipelinedOrderID = `(lpad(to_hex((extract(epoch FROM now()) * 1000)::bigint), 12, '0') || lpad(to_hex(:r::bigint), 20, '0'))::uuid`

// postOrderStatements are the order, its one line and its order.placed
// outbox row, given the first statement's values of the order's id and its
// RETURNING clause, and the SQL of the id and of the time in the later two.
func postOrderStatements(newID, returning, orderID, placedAt string) string {
	return `INSERT INTO orders (id, customer, email, currency, status, total_cents, version, created_at, updated_at)
VALUES (` + newID + `, 'bench', 'bench@example.com', 'EUR', 'placed', 2500, 1, now(), now())
` + returning + `
INSERT INTO order_lines (order_id, line_no, sku, quantity, unit_price_cents)
SELECT ` + orderID + `::uuid, unnest(ARRAY[1]::integer[]), unnest(ARRAY['BOOK-1']::text[]),
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
FROM (SELECT ` + uuidV7SQL + ` AS event_id, 'order'::text AS aggregate_type, ` + orderID + `::text AS aggregate_id,
             1::bigint AS aggregate_version, 'order.placed'::text AS event_type, 1 AS schema_version,
             jsonb_build_object('order_id', ` + orderID + `::text, 'customer', 'bench', 'email', 'bench@example.com',
                 'currency', 'EUR', 'items', jsonb_build_array(jsonb_build_object('sku', 'BOOK-1', 'quantity', 2, 'unit_price_cents', 1250)),
                 'total_cents', 2500, 'placed_at', ` + placedAt + `) AS payload,
             ''::text AS traceparent, ''::text AS tracestate) e
LEFT JOIN outbox_publish_mode m ON m.event_type = e.event_type
RETURNING event_id, publish_mode, created_at;
`
}

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
	res, err := b.loadRun(ctx, sc, srv, base, map[string]int{"orders serve": srv.pid(), "devbroker": broker.pid()})
	if err != nil {
		return res, err
	}
	b.rep.LoadTool = res.Tool
	return res, b.stopProc(sc, broker)
}

// bareRun measures cmd/bench/bareapi, the least a Go HTTP service must do
// for POST /orders, on a fresh database under the same closed loop.
func (b *bench) bareRun(ctx context.Context, sc string) (loadResult, error) {
	db, err := b.ordersDB(ctx, "bare")
	if err != nil {
		return loadResult{}, err
	}
	addr, err := freeAddr()
	if err != nil {
		return loadResult{}, err
	}
	const name = "bareapi"
	srv, err := b.start(name, b.bins["bareapi"], map[string]string{
		"DATABASE_URL": b.dbURL(db), "BAREAPI_ADDR": addr, "BAREAPI_TOKEN": customerToken})
	if err != nil {
		return loadResult{}, err
	}
	base := "http://" + addr
	if err := srv.waitHTTP(ctx, base+"/readyz"); err != nil {
		return loadResult{}, err
	}
	return b.loadRun(ctx, sc, srv, base, map[string]int{name: srv.pid()})
}

// loadRun puts the closed-loop load of POST /orders on srv at base,
// measuring the CPU of the processes in pids and of the load generator,
// and stops srv, recording its peak RSS under sc.
func (b *bench) loadRun(ctx context.Context, sc string, srv *proc, base string, pids map[string]int) (loadResult, error) {
	pids["bench (load)"] = selfPID()
	meter := startCPU(pids, b.runID)
	res, err := b.closedLoad(ctx, meter, base, b.opts.Conns, b.opts.APIDuration)
	if err != nil {
		return res, err
	}
	res.CPU = meter.stop()
	if err := srv.check(); err != nil {
		return res, err
	}
	if res.OK == 0 {
		return res, fmt.Errorf("%s: no order was created (%d failures); end of its log:\n%s", srv.name, res.Other, tail(srv.logPath, 10))
	}
	b.logf("%s: %d orders in %s (%d failed requests); %s", srv.name, res.OK, res.Duration.Round(time.Millisecond), res.Other, res.CPU)
	return res, b.stopProc(sc, srv)
}

// pgbenchRun runs one of the POST /orders scripts with pgbench on a fresh
// database and returns its transactions per second.
func (b *bench) pgbenchRun(ctx context.Context, name, text string) (float64, cores, error) {
	db, err := b.ordersDB(ctx, "pgbench")
	if err != nil {
		return 0, cores{}, err
	}
	script := filepath.Join(b.dir, name+".sql")
	if err := os.WriteFile(script, []byte(text), 0o644); err != nil {
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
		b.logf("pgbench (%s): %.0f transactions/s over %ds; %s", name, tps, secs, used)
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
	bare, err := b.bareRun(ctx, sc)
	if err != nil {
		return err
	}
	tps, pgCPU, err := b.pgbenchRun(ctx, "pipelined", pgbenchPipelined)
	if err != nil {
		return err
	}
	tpsEach, _, err := b.pgbenchRun(ctx, "per-statement", pgbenchScript)
	if err != nil {
		return err
	}
	ref := fmt.Sprintf("pgbench -c%d -j%d, one pipeline", b.opts.Conns, min(2, b.opts.Conns))
	b.rep.add(result{Scenario: sc, Figure: "POST /orders, relay on", Value: on.rate(), Unit: "orders/s",
		Reference: ref, RefValue: tps, Target: "ratio >= 0.8",
		Note: fmt.Sprintf("%s for %s per run, fresh database each; pgbench runs the service's statements (order, one line, one outbox row) with -M prepared, as one pipeline outside an explicit transaction as the service sends them; the service uses its default pool size", on.Tool, b.opts.APIDuration)})
	b.rep.add(result{Scenario: sc, Figure: "POST /orders, relay off", Value: off.rate(), Unit: "orders/s",
		Reference: ref, RefValue: tps, Target: "-"})
	b.rep.add(result{Scenario: sc, Figure: "POST /orders, relay on", Value: on.rate(), Unit: "orders/s",
		Reference: "pgbench, a round trip per statement", RefValue: tpsEach, Target: "-",
		Note: "the same statements inside BEGIN and COMMIT, each in its own round trip: five per order"})
	b.rep.add(result{Scenario: sc, Figure: "relay on / relay off", Value: on.rate(), Unit: "orders/s",
		Reference: "relay off", RefValue: off.rate(), Target: "-"})
	b.rep.add(result{Scenario: sc, Figure: "bare net/http and pgx (cmd/bench/bareapi)", Value: bare.rate(), Unit: "orders/s",
		Reference: ref, RefValue: tps, Target: "-",
		Note: "the least a Go HTTP service must do for the create: token, JSON in and out, UUIDv7s, the payload, the same three statements in one round trip from 16 connections; no router, idempotency, logs, metrics, traces or relay"})
	b.rep.add(result{Scenario: sc, Figure: "POST /orders, relay off", Value: off.rate(), Unit: "orders/s",
		Reference: "bare net/http and pgx", RefValue: bare.rate(), Target: "-",
		Note: "what the service's own machinery costs beyond the least"})
	// Where the CPU went: on a machine whose cores are all busy, the
	// service's own share (and the broker's, with the relay on) is what
	// pgbench does not pay.
	for _, run := range []struct {
		name string
		c    cores
	}{{"relay on", on.CPU}, {"relay off", off.CPU}, {"bare", bare.CPU}, {"pgbench", pgCPU}} {
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
