-- name: AdminStats :many
-- Counts and the oldest event by event type and state, for operators
-- (O4). Delivered rows are counted too, so this reads the whole table: it
-- is an on-demand report, never a metric.
SELECT event_type, state, count(*)::bigint AS n, min(created_at)::timestamptz AS oldest
FROM outbox
GROUP BY event_type, state
ORDER BY event_type, state;

-- name: AdminParked :many
-- Parked events, oldest first, optionally of one type, one aggregate, or
-- parked since a time (the time of the last attempt).
SELECT event_id, aggregate_type, aggregate_id, aggregate_version, event_type, schema_version,
       created_at, attempts, last_error_class, last_error
FROM outbox
WHERE state = 'parked'
  AND (sqlc.narg('event_type')::text IS NULL OR event_type = sqlc.narg('event_type'))
  AND (sqlc.narg('aggregate_id')::text IS NULL OR aggregate_id = sqlc.narg('aggregate_id'))
  AND (sqlc.narg('since')::timestamptz IS NULL OR next_attempt_at >= sqlc.narg('since'))
ORDER BY created_at, event_id
LIMIT @row_limit;

-- name: AdminEventGet :one
SELECT * FROM outbox WHERE event_id = @event_id;

-- name: AdminEventLock :one
SELECT * FROM outbox WHERE event_id = @event_id FOR UPDATE;

-- name: AdminArchivedGet :one
SELECT * FROM outbox_archive WHERE event_id = @event_id;

-- name: AdminRepair :one
-- Replaces the payload and schema version of a parked event. It stays
-- parked until an operator resumes it: repair and resume are two decisions.
UPDATE outbox
SET payload = @payload, schema_version = @schema_version,
    last_error_class = 'repaired', last_error = left(@note::text, 1024)
WHERE event_id = @event_id AND state = 'parked'
RETURNING *;

-- name: AdminResume :many
-- Puts parked events back to pending with the same event_id and version,
-- due now. Attempts are kept: the history of the event is not rewritten.
UPDATE outbox
SET state = 'pending', next_attempt_at = clock_timestamp(),
    lease_owner = NULL, lease_token = NULL, lease_expires_at = NULL
WHERE state = 'parked'
  AND (event_id = ANY (@event_ids::uuid[]) OR event_type = sqlc.narg('event_type'))
RETURNING *;

-- name: AdminParkedForResume :many
SELECT * FROM outbox
WHERE state = 'parked'
  AND (event_id = ANY (@event_ids::uuid[]) OR event_type = sqlc.narg('event_type'))
ORDER BY event_id
FOR UPDATE;

-- name: AuditInsert :exec
INSERT INTO outbox_audit (actor, action, target, reason, before_sha256, after_sha256, detail)
VALUES (@actor, @action, @target, left(@reason::text, 1024), sqlc.narg('before_sha256'), sqlc.narg('after_sha256'), @detail);

-- name: AuditForTarget :many
SELECT * FROM outbox_audit WHERE target = @target ORDER BY at, id;

-- name: ReplayPlanInsert :exec
INSERT INTO outbox_replay_plan (id, created_by, reason, selector, needs_approval)
VALUES (@id, @created_by, left(@reason::text, 1024), @selector, @needs_approval);

-- name: ReplayItemsInsert :exec
INSERT INTO outbox_replay_item (plan_id, event_id, event_type, created_at, state)
SELECT @plan_id::uuid, unnest(@event_ids::uuid[]), unnest(@event_types::text[]),
       unnest(@created_ats::timestamptz[]), unnest(@states::text[]);

-- name: ReplayPlanGet :one
SELECT * FROM outbox_replay_plan WHERE id = @id;

-- name: ReplayPlanLock :one
SELECT * FROM outbox_replay_plan WHERE id = @id FOR UPDATE;

-- name: ReplayItems :many
SELECT * FROM outbox_replay_item WHERE plan_id = @plan_id ORDER BY created_at, event_id;

-- name: ReplayItemsForEvent :many
SELECT i.*, p.created_by, p.reason, p.status
FROM outbox_replay_item i JOIN outbox_replay_plan p ON p.id = i.plan_id
WHERE i.event_id = @event_id
ORDER BY p.created_at;

-- name: ReplayPlanApprove :exec
UPDATE outbox_replay_plan SET status = 'approved', approved_by = @approved_by, approved_at = clock_timestamp()
WHERE id = @id;

-- name: ReplayPlanStart :exec
UPDATE outbox_replay_plan SET status = 'running', run_by = @run_by, run_started_at = clock_timestamp()
WHERE id = @id;

-- name: ReplayPlanEnd :exec
UPDATE outbox_replay_plan
SET status = @status, run_ended_at = clock_timestamp(), run_error = left(sqlc.narg('run_error')::text, 1024)
WHERE id = @id;

-- name: ReplayEventsByIDs :many
-- The events a plan may replay: rows still in the outbox, delivered (a
-- pending or parked row is the relay's business, not a replay's).
SELECT event_id, aggregate_type, aggregate_id, aggregate_version, event_type, schema_version,
       payload, traceparent, created_at, state
FROM outbox WHERE event_id = ANY (@event_ids::uuid[])
ORDER BY created_at, event_id;

-- name: ReplayEventsByRange :many
SELECT event_id, aggregate_type, aggregate_id, aggregate_version, event_type, schema_version,
       payload, traceparent, created_at, state
FROM outbox
WHERE created_at >= @from_time AND created_at < @to_time
  AND (sqlc.narg('event_type')::text IS NULL OR event_type = sqlc.narg('event_type'))
ORDER BY created_at, event_id
LIMIT @row_limit;

-- name: ArchivedByIDs :many
SELECT event_id, event_type, created_at FROM outbox_archive WHERE event_id = ANY (@event_ids::uuid[]);

-- name: ArchivedByRange :many
SELECT event_id, event_type, created_at FROM outbox_archive
WHERE created_at >= @from_time AND created_at < @to_time
  AND (sqlc.narg('event_type')::text IS NULL OR event_type = sqlc.narg('event_type'))
ORDER BY created_at, event_id
LIMIT @row_limit;

-- name: ReplayItemPublished :exec
UPDATE outbox_replay_item
SET state = 'published', published_at = clock_timestamp(), broker_partition = @broker_partition, broker_offset = @broker_offset
WHERE plan_id = @plan_id AND event_id = @event_id;

-- name: CleanupLock :one
-- One cleanup run at a time across all relays and services (O6), held for
-- the whole run on one session.
SELECT pg_try_advisory_lock(@lock_key::bigint);

-- name: CleanupUnlock :one
SELECT pg_advisory_unlock(@lock_key::bigint);

-- name: ArchiveDelivered :many
-- Moves one batch of delivered rows older than the retention to the
-- archive, oldest first, in one statement: the identity and the broker
-- position stay, the payload goes. Pending and parked rows are never
-- touched, whatever their age. The cursor is the (delivered_at, event_id)
-- of the previous batch's last row: each batch seeks past it in the index
-- instead of wading through the entries the previous batches deleted,
-- which stay in the index until vacuum.
WITH moved AS (
    DELETE FROM outbox o
    WHERE o.event_id IN (
        SELECT d.event_id FROM outbox d
        WHERE d.state = 'delivered'
          AND d.delivered_at < clock_timestamp() - make_interval(secs => @retention_seconds::float8)
          AND (d.delivered_at, d.event_id) > (@after_delivered_at::timestamptz, @after_event_id::uuid)
        ORDER BY d.delivered_at, d.event_id
        LIMIT @batch_size
    )
    RETURNING o.event_id, o.aggregate_type, o.aggregate_id, o.aggregate_version, o.event_type,
              o.schema_version, o.created_at, o.delivered_at, o.broker_partition, o.broker_offset
)
INSERT INTO outbox_archive (event_id, aggregate_type, aggregate_id, aggregate_version, event_type,
                            schema_version, created_at, delivered_at, broker_partition, broker_offset)
SELECT * FROM moved
-- An event archived before (a restored database delivered it again) is
-- archived anew, so every moved row comes back for the cursor.
ON CONFLICT (event_id) DO UPDATE SET delivered_at = EXCLUDED.delivered_at, broker_partition = EXCLUDED.broker_partition,
    broker_offset = EXCLUDED.broker_offset, archived_at = clock_timestamp()
RETURNING event_id, delivered_at;
