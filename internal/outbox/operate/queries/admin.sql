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
-- parked since a time (the time of the last attempt). This and the other
-- statements that ask for state = 'parked' read outbox_parked_idx, which
-- holds the parked rows alone (TestParkedRowsAreReadFromTheirOwnIndex).
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
-- The row is found by primary key: the state is compared with a value the
-- planner learns only when the statement runs (a subquery), never with the
-- literal, which would let it walk every undelivered row through the
-- partial index outbox_undelivered_aggregate_idx whenever its statistics
-- say there are few. Repairs come during incidents, when a backlog is
-- likely (plan_test.go, TestRepairsFindParkedRowsByPrimaryKey).
UPDATE outbox
SET payload = @payload, schema_version = @schema_version,
    last_error_class = 'repaired', last_error = left(@note::text, 1024)
WHERE event_id = @event_id AND state = (SELECT 'parked'::text)
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
-- The plan, locked for a decision, with the database's clock: approvals
-- expire and runners' leases pass on the database's time, never on a
-- client's or an application server's.
SELECT sqlc.embed(outbox_replay_plan), clock_timestamp()::timestamptz AS db_now
FROM outbox_replay_plan WHERE id = @id FOR UPDATE;

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
-- Hands the plan to a runner, for its first run or to continue one that
-- stopped. The first runner and start time stay: the audit names every
-- runner, and the four-eyes rule counts a run from when it began.
UPDATE outbox_replay_plan
SET status = 'running', run_by = coalesce(run_by, @run_by::text), run_started_at = coalesce(run_started_at, clock_timestamp()),
    run_owner = @run_owner::text, run_lease_expires_at = clock_timestamp() + make_interval(secs => @lease_seconds::float8),
    run_ended_at = NULL, run_error = NULL
WHERE id = @id;

-- name: ReplayPlanRenew :execrows
-- A runner's heartbeat. No row means the plan is no longer this runner's:
-- another took it over after the lease passed, and this one must stop.
UPDATE outbox_replay_plan
SET run_lease_expires_at = clock_timestamp() + make_interval(secs => @lease_seconds::float8)
WHERE id = @id AND status = 'running' AND run_owner = @run_owner::text;

-- name: ReplayPlanEnd :execrows
-- Ends a runner's part: done, failed, or interrupted (resumable, so not
-- ended). Only the plan's current runner can end it.
UPDATE outbox_replay_plan
SET status = @status::text, run_error = left(sqlc.narg('run_error')::text, 1024),
    run_ended_at = CASE WHEN @status::text = 'interrupted' THEN NULL ELSE clock_timestamp() END,
    run_owner = NULL, run_lease_expires_at = NULL
WHERE id = @id AND status = 'running' AND run_owner = @run_owner::text;

-- name: ReplayPlansToContinue :many
-- Plans whose runner stopped: interrupted, or running on a lease that has
-- passed (the runner died without a word), oldest first.
SELECT id FROM outbox_replay_plan
WHERE status = 'interrupted'
   OR (status = 'running' AND (run_lease_expires_at IS NULL OR run_lease_expires_at < clock_timestamp()))
ORDER BY created_at
LIMIT @row_limit;

-- name: ReplayPlanRequireApproval :exec
UPDATE outbox_replay_plan SET needs_approval = true WHERE id = @id AND status = 'planned';

-- name: ReplaySoloEventsLock :exec
-- Serialises the four-eyes decisions about one admin, so that two plans
-- made at the same moment cannot each see the other's events missing.
SELECT pg_advisory_xact_lock(hashtextextended('outbox_replay_solo:' || @admin::text, 0));

-- name: ReplaySoloEvents :one
-- The events of plans that one admin planned or started within the window
-- without a second admin: what that admin replays alone. Plans that need
-- an approval, or got one, do not count: a second admin shares them. The
-- window is on the database's clock.
SELECT count(*)::bigint
FROM outbox_replay_item i JOIN outbox_replay_plan p ON p.id = i.plan_id
WHERE i.state <> 'skipped_archived' AND NOT p.needs_approval AND p.approved_by IS NULL AND p.id <> @plan_id
  AND ((p.created_by = @admin AND p.created_at >= clock_timestamp() - make_interval(secs => @window_seconds::float8))
    OR (p.run_by = @admin AND p.run_started_at >= clock_timestamp() - make_interval(secs => @window_seconds::float8)));

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

-- name: ReplayItemPublished :execrows
-- Records one publication, only while the plan is still this runner's. The
-- plan row is read FOR SHARE, so the record waits for a takeover in
-- progress and then sees the new runner: a runner that lost its plan gets
-- no row and stops, and the new runner never finds an item published
-- behind its back.
UPDATE outbox_replay_item
SET state = 'published', published_at = clock_timestamp(), broker_partition = @broker_partition, broker_offset = @broker_offset
WHERE plan_id = @plan_id AND event_id = @event_id AND state = 'planned'
  AND EXISTS (SELECT 1 FROM outbox_replay_plan p
              WHERE p.id = @plan_id AND p.status = 'running' AND p.run_owner = @run_owner::text
              FOR SHARE);

-- name: GroupParkedRows :many
-- Every parked event's identity and failure, for the failure groups. The
-- fingerprint is computed in Go (groups.go), one rule for the list and the
-- bulk actions. Reads the parked rows alone, from outbox_parked_idx
-- (migration 00010), however large the backlog beside them.
SELECT event_id, event_type, created_at, last_error_class, last_error
FROM outbox
WHERE state = 'parked'
ORDER BY created_at, event_id;

-- name: GroupParkedLock :many
-- The parked rows among a batch of ids, locked for a bulk resume, which
-- checks each is still in its group before releasing it. Found by primary
-- key, as AdminRepair's row is and for the same reason.
SELECT * FROM outbox
WHERE state = (SELECT 'parked'::text) AND event_id = ANY (@event_ids::uuid[])
ORDER BY event_id
FOR UPDATE;

-- name: AuditList :many
-- The audit trail, newest first, narrowed by actor, target and time.
SELECT * FROM outbox_audit
WHERE (sqlc.narg('actor')::text IS NULL OR actor = sqlc.narg('actor'))
  AND (sqlc.narg('target')::text IS NULL OR target = sqlc.narg('target'))
  AND (sqlc.narg('from_at')::timestamptz IS NULL OR at >= sqlc.narg('from_at'))
  AND (sqlc.narg('to_at')::timestamptz IS NULL OR at < sqlc.narg('to_at'))
ORDER BY at DESC, id DESC
LIMIT @row_limit;

-- name: EventsByTrace :many
-- Events written inside one trace: the traceparent's trace id is its
-- second field ("00-<trace id>-<span id>-<flags>").
SELECT event_id, aggregate_type, aggregate_id, aggregate_version, event_type, schema_version,
       created_at, attempts, last_error_class, last_error
FROM outbox
WHERE traceparent LIKE '00-' || @trace_id::text || '-%'
ORDER BY created_at, event_id
LIMIT 100;

-- name: EventsByAggregate :many
-- Events of one aggregate still in the outbox, in version order.
SELECT event_id, aggregate_type, aggregate_id, aggregate_version, event_type, schema_version,
       created_at, attempts, last_error_class, last_error, state
FROM outbox
WHERE aggregate_type = @aggregate_type AND aggregate_id = @aggregate_id
ORDER BY aggregate_version;

-- name: RelayActivity :many
-- The relays alive now (their heartbeat rows, renewed with their partition
-- leases about every second) with how many partitions of the aggregates
-- each owns. A relay that has just started may own none yet; the others
-- give it its share within a lease.
SELECT r.owner, count(p.partition)::bigint AS partitions, r.expires_at
FROM outbox_relay r
LEFT JOIN outbox_relay_partition p ON p.owner = r.owner AND p.lease_expires_at > now()
WHERE r.expires_at > now()
GROUP BY r.owner, r.expires_at
ORDER BY r.owner;

