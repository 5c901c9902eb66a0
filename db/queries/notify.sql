-- name: ProjectionGet :one
SELECT * FROM order_projection WHERE order_id = @order_id;

-- name: ProjectionUpsert :execrows
-- Writes the order's new state. The WHERE on the update makes it a no-op
-- when the stored version is not older, so the projection can never move
-- backwards even if a caller got the ordering wrong; the caller checks the
-- row count.
INSERT INTO order_projection (order_id, email, status, currency, total_cents,
                              refund_requested_cents, version, last_event_id)
VALUES (@order_id, @email, @status, sqlc.narg('currency'), sqlc.narg('total_cents'),
        sqlc.narg('refund_requested_cents'), @version, sqlc.narg('last_event_id'))
ON CONFLICT (order_id) DO UPDATE
SET email                  = EXCLUDED.email,
    status                 = EXCLUDED.status,
    currency               = coalesce(EXCLUDED.currency, order_projection.currency),
    total_cents            = coalesce(EXCLUDED.total_cents, order_projection.total_cents),
    refund_requested_cents = coalesce(EXCLUDED.refund_requested_cents, order_projection.refund_requested_cents),
    version                = EXCLUDED.version,
    last_event_id          = EXCLUDED.last_event_id,
    updated_at             = clock_timestamp()
WHERE order_projection.version < EXCLUDED.version;

-- name: ProjectionGetMany :many
-- The projections of a batch's orders, read once for the whole batch.
SELECT * FROM order_projection WHERE order_id = ANY(@order_ids::uuid[]);

-- name: ProjectionUpsertMany :execrows
-- ProjectionUpsert for a batch: one row per order, its state after the
-- batch's last event of it. The arrays are parallel, one element per
-- order (set-returning functions in one select list advance together).
-- A nullable number comes as a value and a "has a value" flag, since the
-- generated array parameters cannot carry NULL elements; an empty
-- currency means none. The caller checks that every row was written.
INSERT INTO order_projection (order_id, email, status, currency, total_cents,
                              refund_requested_cents, version, last_event_id)
SELECT u.order_id, u.email, u.status, nullif(u.currency, ''),
       CASE WHEN u.has_total THEN u.total_cents END,
       CASE WHEN u.has_refund THEN u.refund_cents END,
       u.version, u.last_event_id
FROM (SELECT unnest(@order_ids::uuid[]) AS order_id, unnest(@emails::text[]) AS email,
             unnest(@statuses::text[]) AS status, unnest(@currencies::text[]) AS currency,
             unnest(@total_cents::bigint[]) AS total_cents, unnest(@has_total::boolean[]) AS has_total,
             unnest(@refund_cents::bigint[]) AS refund_cents, unnest(@has_refund::boolean[]) AS has_refund,
             unnest(@versions::bigint[]) AS version, unnest(@last_event_ids::uuid[]) AS last_event_id) u
ON CONFLICT (order_id) DO UPDATE
SET email                  = EXCLUDED.email,
    status                 = EXCLUDED.status,
    currency               = coalesce(EXCLUDED.currency, order_projection.currency),
    total_cents            = coalesce(EXCLUDED.total_cents, order_projection.total_cents),
    refund_requested_cents = coalesce(EXCLUDED.refund_requested_cents, order_projection.refund_requested_cents),
    version                = EXCLUDED.version,
    last_event_id          = EXCLUDED.last_event_id,
    updated_at             = clock_timestamp()
WHERE order_projection.version < EXCLUDED.version;

-- name: ProjectionReplace :exec
-- Replaces the order's state whatever its version: a resync of an order
-- whose history forked (inbox Snapshot.Rebase). What the lost history held
-- goes, refunds included, since the orders API's view is the truth.
INSERT INTO order_projection (order_id, email, status, currency, total_cents, version)
VALUES (@order_id, @email, @status, sqlc.narg('currency'), sqlc.narg('total_cents'), @version)
ON CONFLICT (order_id) DO UPDATE
SET email                  = EXCLUDED.email,
    status                 = EXCLUDED.status,
    currency               = EXCLUDED.currency,
    total_cents            = EXCLUDED.total_cents,
    refund_requested_cents = NULL,
    version                = EXCLUDED.version,
    last_event_id          = NULL,
    updated_at             = clock_timestamp();

-- name: EmailSendInsert :one
-- The email intent, written in the event's transaction, pending or, with a
-- skip_reason, skipped. A second insert for the same operation key returns
-- no row and the caller reads the first: one row per event, ever.
INSERT INTO email_send (operation_key, event_id, message_id, order_id, event_type,
                        aggregate_version, event_time, recipient, subject, body, state, skip_reason,
                        traceparent, tracestate)
VALUES (@operation_key, @event_id, @message_id, @order_id, @event_type,
        @aggregate_version, @event_time, @recipient, @subject, @body,
        CASE WHEN sqlc.narg('skip_reason')::text IS NULL THEN 'pending' ELSE 'skipped' END,
        sqlc.narg('skip_reason'), sqlc.narg('traceparent'), sqlc.narg('tracestate'))
ON CONFLICT (operation_key) DO NOTHING
RETURNING *;

-- name: EmailSendInsertMany :exec
-- EmailSendInsert for a batch's pending emails: a row that exists (the
-- event came back) is left as it is. Empty trace fields mean none.
INSERT INTO email_send (operation_key, event_id, message_id, order_id, event_type,
                        aggregate_version, event_time, recipient, subject, body, state,
                        traceparent, tracestate)
SELECT u.operation_key, u.event_id, u.message_id, u.order_id, u.event_type,
       u.aggregate_version, u.event_time, u.recipient, u.subject, u.body, 'pending',
       nullif(u.traceparent, ''), nullif(u.tracestate, '')
FROM (SELECT unnest(@operation_keys::text[]) AS operation_key, unnest(@event_ids::uuid[]) AS event_id,
             unnest(@message_ids::text[]) AS message_id, unnest(@order_ids::uuid[]) AS order_id,
             unnest(@event_types::text[]) AS event_type, unnest(@aggregate_versions::bigint[]) AS aggregate_version,
             unnest(@event_times::timestamptz[]) AS event_time, unnest(@recipients::text[]) AS recipient,
             unnest(@subjects::text[]) AS subject, unnest(@bodies::text[]) AS body,
             unnest(@traceparents::text[]) AS traceparent, unnest(@tracestates::text[]) AS tracestate) u
ON CONFLICT (operation_key) DO NOTHING;

-- name: EmailSendLatestVersions :many
-- The highest version each order has an email for: EmailSendLaterExists
-- for a whole batch, read once before its rows are written; 0 when the
-- order has no email yet (versions start at 1). One backward
-- step on email_send_order_version_idx per order: written as a plain
-- "order_id = ANY(...) GROUP BY", the planner may read the whole ledger.
SELECT u.order_id::uuid AS order_id,
       coalesce((SELECT e.aggregate_version FROM email_send e
                 WHERE e.order_id = u.order_id AND e.aggregate_version IS NOT NULL
                 ORDER BY e.aggregate_version DESC LIMIT 1), 0)::bigint AS latest_version
FROM unnest(@order_ids::uuid[]) AS u(order_id);

-- name: EmailSendLaterExists :one
-- Whether the order already has an email for a later version: an email
-- written now arrives after it and says so.
SELECT EXISTS (
    SELECT 1 FROM email_send
    WHERE order_id = @order_id AND aggregate_version > @aggregate_version
)::boolean;

-- name: EmailSendGet :one
SELECT * FROM email_send WHERE operation_key = @operation_key;

-- name: EmailSendListByOrder :many
SELECT * FROM email_send WHERE order_id = @order_id ORDER BY created_at, operation_key;

-- name: EmailSendListByState :many
SELECT * FROM email_send WHERE state = @state ORDER BY created_at, operation_key LIMIT @row_limit;

-- name: EmailSendSkipStale :many
-- Emails that could not be sent before their event grew older than the
-- maximum age are skipped, never sent: a consumer group starting at the
-- beginning of a long topic must not email its whole history. Only rows
-- never attempted: an email that was tried in time and is being retried
-- is not stale. Read from email_send_never_attempted_idx: only the rows it
-- skips, however long the backlog (now() bounds the scan; see the claim).
UPDATE email_send
SET state = 'skipped', skip_reason = 'stale'
WHERE state = 'pending' AND attempts = 0
  AND event_time < now() - make_interval(secs => @max_age_seconds::float8)
RETURNING operation_key, event_id, order_id, event_type, event_time;

-- name: EmailSendClaimOne :one
-- Claims the next due row in a short transaction, with the worker's
-- previous result if it has one; the send happens after commit. One row per claim, so that only an email whose send
-- has really begun is ever 'sending': a sender that dies leaves at most one
-- row for the stuck-send sweep. SKIP LOCKED lets several senders share the
-- ledger. Unknown rows are claimed only under the resend policy. A sender
-- with several workers gives each its share of the orders (by the last byte
-- of the order id, which is random), so one order's emails still go out one
-- after the other, in the order they were written, as with one worker.
--
-- Each state is read from its own index, in the order of the ORDER BY
-- (email_send_pending_due_idx, email_send_unknown_due_idx), and each branch
-- stops at its first row of this worker's share: the two candidates are
-- compared and the earlier one is claimed. Written as one scan with
-- "state = 'pending' OR state = 'unknown'", the planner must merge two
-- states and sorts; with statistics from before a backlog it reads and
-- sorts every due row for each claim. now(), not clock_timestamp(), bounds
-- the index scan (a volatile bound is only a filter, and an idle worker
-- would read every row waiting out a retry delay); now() is the start of
-- the claim's implicit transaction, which holds at most the previous
-- send's result update before it. The sender runs it with sorting
-- turned off (indexOrder in internal/notify/sender.go): with statistics
-- from before a backlog, the indexes alone do not stop the planner from
-- preferring a sort. The candidate not chosen stays locked only until this
-- statement commits.
--
-- pending_floor is where the pending branch starts in its index
-- (EmailSendPendingFloor, below): a claim leaves its row's old entry in
-- email_send_pending_due_idx until the ledger is next vacuumed, and the
-- ledger keeps its sent rows for the retention, so a walk from the start
-- of the index would step over every email claimed since the last vacuum,
-- on every claim.
UPDATE email_send
SET state = 'sending', claim_token = @claim_token::uuid, claimed_by = @claimed_by::text,
    sending_since = clock_timestamp(), attempts = attempts + 1
WHERE operation_key = (
    SELECT c.operation_key
    -- Each branch is a subquery of its own: a locking clause is not allowed
    -- directly in a UNION's branches.
    FROM (SELECT * FROM (SELECT e.operation_key, e.next_attempt_at FROM email_send e
                         WHERE e.state = 'pending' AND e.next_attempt_at <= now()
                           AND e.next_attempt_at >= @pending_floor::timestamptz
                           AND get_byte(uuid_send(e.order_id), 15) % @workers::integer = @worker::integer
                         ORDER BY e.next_attempt_at, e.operation_key
                         LIMIT 1
                         FOR UPDATE SKIP LOCKED) p
          UNION ALL
          SELECT * FROM (SELECT e.operation_key, e.next_attempt_at FROM email_send e
                         WHERE e.state = 'unknown' AND @resend_unknown::boolean AND e.attempts < @max_attempts::integer
                           AND e.next_attempt_at <= now()
                           AND get_byte(uuid_send(e.order_id), 15) % @workers::integer = @worker::integer
                         ORDER BY e.next_attempt_at, e.operation_key
                         LIMIT 1
                         FOR UPDATE SKIP LOCKED) u) c
    ORDER BY c.next_attempt_at, c.operation_key
    LIMIT 1
)
RETURNING *;

-- name: EmailSendPendingFloor :one
-- Where the claims' pending branch starts (EmailSendClaimOne): the
-- earliest next_attempt_at of a pending row, or late_seconds ago if that is
-- earlier. The sender finds it again about once a second; each search is
-- the one walk over the entries of rows claimed since the last vacuum.
-- A row that becomes pending later is at or above it when it is a retry
-- (clock_timestamp() plus backoff), an operator's resend
-- (clock_timestamp()) or an email written by a transaction that committed
-- within late_seconds of writing it; a row written by a transaction that
-- stayed open longer, or given back by a stopping sender, waits for the
-- next search, which moves the floor down to it. Run in index order like
-- the claim (indexOrder).
SELECT least(
           coalesce((SELECT e.next_attempt_at
                     FROM email_send e
                     WHERE e.state = 'pending'
                     ORDER BY e.next_attempt_at, e.operation_key
                     LIMIT 1), 'infinity'),
           now() - make_interval(secs => @late_seconds::double precision))::timestamptz AS pending_floor;

-- name: EmailSendMarkSent :execrows
-- Fenced by the claim token. 'unknown' is accepted too: if the stuck-send
-- sweep gave up on this attempt but the attempt then learned it succeeded,
-- the better-informed answer wins.
UPDATE email_send
SET state = 'sent', sent_at = clock_timestamp(), smtp_reply = left(@smtp_reply::text, 1024),
    last_error_class = NULL, last_error = NULL
WHERE operation_key = @operation_key AND claim_token = @claim_token::uuid
  AND state IN ('sending', 'unknown');

-- name: EmailSendMarkRetry :execrows
UPDATE email_send
SET state = 'pending',
    next_attempt_at = clock_timestamp() + make_interval(secs => @backoff_seconds::float8),
    last_error_class = @error_class::text, last_error = left(@last_error::text, 1024)
WHERE operation_key = @operation_key AND claim_token = @claim_token::uuid AND state = 'sending';

-- name: EmailSendMarkUnknown :execrows
-- next_attempt_at only matters under the resend policy.
UPDATE email_send
SET state = 'unknown',
    next_attempt_at = clock_timestamp() + make_interval(secs => @backoff_seconds::float8),
    last_error_class = @error_class::text, last_error = left(@last_error::text, 1024)
WHERE operation_key = @operation_key AND claim_token = @claim_token::uuid AND state = 'sending';

-- name: EmailSendMarkFailed :execrows
UPDATE email_send
SET state = 'failed', last_error_class = @error_class::text, last_error = left(@last_error::text, 1024)
WHERE operation_key = @operation_key AND claim_token = @claim_token::uuid AND state = 'sending';

-- name: EmailSendMarkSkipped :execrows
-- A claimed row the sender decided not to send (its event is stale): no
-- send was attempted, so the attempt the claim counted is given back.
UPDATE email_send
SET state = 'skipped', skip_reason = @skip_reason::text, attempts = attempts - 1,
    claim_token = NULL, claimed_by = NULL, sending_since = NULL
WHERE operation_key = @operation_key AND claim_token = @claim_token::uuid AND state = 'sending';

-- name: EmailSendRelease :execrows
-- Gives back a claimed row that a stopping sender did not start sending, so
-- it is not mistaken for a crashed send.
UPDATE email_send
SET state = 'pending', attempts = attempts - 1, claim_token = NULL, claimed_by = NULL, sending_since = NULL
WHERE operation_key = @operation_key AND claim_token = @claim_token::uuid AND state = 'sending';

-- name: EmailSendSweepStuck :many
-- A row still 'sending' long after any send could have finished belongs to
-- a sender that died mid-send. Whether the email left is unknown, so it is
-- never put back to pending: it becomes 'unknown', or 'failed' when the
-- resend policy has used up its attempts.
UPDATE email_send
SET state = CASE WHEN @resend_unknown::boolean AND attempts >= @max_attempts::integer THEN 'failed' ELSE 'unknown' END,
    next_attempt_at = clock_timestamp(),
    last_error_class = 'sending_timeout',
    last_error = 'still sending after ' || @timeout_seconds::float8 || 's: sender presumed dead'
WHERE state = 'sending'
  AND sending_since < clock_timestamp() - make_interval(secs => @timeout_seconds::float8)
RETURNING operation_key, event_id, state;

-- name: EmailSendResolve :execrows
-- Operator resolution of an unknown or failed row, recorded with the actor.
-- 'sent' closes it, 'pending' asks for one more send with the same
-- Message-ID, 'failed' gives up.
UPDATE email_send
SET state = @new_state, next_attempt_at = clock_timestamp(),
    resolved_by = @actor::text, resolved_at = clock_timestamp(), resolution = @resolution::text
WHERE operation_key = @operation_key AND state IN ('unknown', 'failed');

-- name: EmailSendCountOpen :many
-- The ledger gauges' exact part: the states the sender or an operator still
-- has to act on, and skipped, each counted from a partial index that holds
-- exactly its rows (email_send_pending_due_idx, email_send_sending_idx,
-- email_send_rare_state_idx), so a refresh reads these rows only, never the
-- whole ledger. A state with no row has no row here.
SELECT 'pending'::text AS state, count(*) AS n FROM email_send WHERE state = 'pending' HAVING count(*) > 0
UNION ALL
SELECT 'sending'::text, count(*) FROM email_send WHERE state = 'sending' HAVING count(*) > 0
UNION ALL
SELECT state, count(*) FROM email_send WHERE state IN ('unknown', 'failed', 'skipped') GROUP BY state;

-- name: EmailSendEstimateFinished :many
-- Sent rows are nearly the whole ledger, and counting them exactly every few
-- seconds would read all of it: they are estimated from the planner's
-- statistics (the table's row estimate times the state's frequency), which
-- autovacuum's ANALYZE keeps current. No row before the first ANALYZE.
SELECT v.state::text AS state, round(greatest(c.reltuples, 0) * s.most_common_freqs[v.i])::bigint AS n
FROM pg_catalog.pg_class c
JOIN pg_catalog.pg_namespace ns ON ns.oid = c.relnamespace
JOIN pg_catalog.pg_stats s ON s.schemaname = ns.nspname AND s.tablename = c.relname AND s.attname = 'state'
CROSS JOIN LATERAL unnest(s.most_common_vals::text::text[]) WITH ORDINALITY AS v(state, i)
WHERE c.oid = 'email_send'::regclass AND v.state = 'sent';

-- name: EmailLedgerCleanupLock :one
-- One ledger cleaner at a time, for the whole run (O6).
SELECT pg_try_advisory_lock(@lock_key::bigint);

-- name: EmailLedgerCleanupUnlock :one
SELECT pg_advisory_unlock(@lock_key::bigint);

-- name: EmailSendCleanup :one
-- Deletes one batch of finished emails (sent or skipped) older than the
-- retention. Unknown and failed rows are kept until an operator resolves
-- them. It returns how many it deleted and the last one's
-- (created_at, operation_key) in the index's order, the cursor the next
-- batch seeks past: from the start of the index each batch would first step
-- over the entries of the batches before it, left until the next vacuum
-- (ProcessedEventCleanup in the inbox's queries says more).
WITH gone AS (
    DELETE FROM email_send
    WHERE operation_key IN (
        SELECT e.operation_key FROM email_send e
        WHERE e.state IN ('sent', 'skipped')
          -- now(), not clock_timestamp(): see ProcessedEventCleanup in the
          -- inbox's queries; a volatile cutoff cannot bound the index scan.
          AND e.created_at < now() - make_interval(secs => @ttl_seconds::float8)
          AND (e.created_at, e.operation_key) > (@after_created_at::timestamptz, @after_operation_key::text)
        ORDER BY e.created_at, e.operation_key
        LIMIT @batch_size
    )
    RETURNING created_at, operation_key
), last AS (
    SELECT g.created_at, g.operation_key FROM gone g
    ORDER BY g.created_at DESC, g.operation_key DESC
    LIMIT 1
)
SELECT (SELECT count(*) FROM gone)::bigint AS deleted,
       coalesce((SELECT l.created_at FROM last l), @after_created_at::timestamptz)::timestamptz AS last_created_at,
       coalesce((SELECT l.operation_key FROM last l), @after_operation_key::text)::text AS last_operation_key;

-- name: AdminRowHashSettings :exec
-- Row hashes (sha256 of to_jsonb(row)) depend on how timestamps and bytes
-- print; fixed for the rest of the transaction (see admin_audit).
SELECT set_config('TimeZone', 'UTC', true), set_config('bytea_output', 'hex', true);

-- name: EmailSendLockForResolve :one
-- The row an operator resolves, locked until the transaction ends, with
-- the hash of the row.
SELECT sqlc.embed(e), sha256(convert_to(to_jsonb(e)::text, 'UTF8'))::bytea AS row_sha256
FROM email_send e
WHERE e.operation_key = @operation_key
FOR UPDATE;

-- name: AdminAuditInsert :one
-- One audited write, in the transaction of the change (admin_audit).
INSERT INTO admin_audit (actor, action, target, reason, before_sha256, after_sha256, detail)
VALUES (@actor, @action, @target, @reason, @before_sha256, @after_sha256, @detail)
RETURNING id, at;

-- name: AdminAuditListForTarget :many
SELECT * FROM admin_audit WHERE target = @target ORDER BY id;

-- name: JourneyInboxMarker :one
-- The notifier's part of one event's journey (admin API): the inbox's
-- marker of the event, when it has one (no row: never received, or cleaned
-- up after the inbox's TTL), with the version the inbox holds for its
-- aggregate now.
SELECT p.event_id, p.aggregate_type, p.aggregate_id, p.aggregate_version, p.event_type, p.outcome,
       p.received_at, p.processed_at, a.last_version AS inbox_version
FROM processed_event p
LEFT JOIN inbox_aggregate a ON a.aggregate_type = p.aggregate_type AND a.aggregate_id = p.aggregate_id
WHERE p.event_id = @event_id;

-- name: JourneyInboxVersion :one
-- The version the inbox holds for an aggregate, for a journey whose event
-- has no marker.
SELECT last_version FROM inbox_aggregate WHERE aggregate_type = @aggregate_type AND aggregate_id = @aggregate_id;

-- name: JourneyProjection :one
-- The order's projection without its customer's address.
SELECT order_id, status, version, last_event_id, updated_at FROM order_projection WHERE order_id = @order_id;

-- name: JourneyEmailByEvent :one
-- The ledger row of one event (event_id is unique in the ledger).
SELECT * FROM email_send WHERE event_id = @event_id;
