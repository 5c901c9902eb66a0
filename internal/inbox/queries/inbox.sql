-- name: InboxAggregateEnsure :exec
-- Creates the aggregate's version row on first sight, so that the lock below
-- always has a row to take.
INSERT INTO inbox_aggregate (aggregate_type, aggregate_id)
VALUES (@aggregate_type, @aggregate_id)
ON CONFLICT (aggregate_type, aggregate_id) DO NOTHING;

-- name: InboxAggregateLock :one
-- Serialises all decisions about one aggregate until the transaction ends.
SELECT * FROM inbox_aggregate
WHERE aggregate_type = @aggregate_type AND aggregate_id = @aggregate_id
FOR UPDATE;

-- name: InboxAggregateAdvance :execrows
-- Moves the applied version forward, never backwards: a caller that passes
-- a version at or below the current one updates nothing.
UPDATE inbox_aggregate
SET last_version = @new_version, updated_at = clock_timestamp()
WHERE aggregate_type = @aggregate_type AND aggregate_id = @aggregate_id
  AND last_version < @new_version;

-- name: InboxAggregateOpenGap :exec
-- Starts the gap clock unless it is already running: the window counts from
-- the first held event, not the latest.
UPDATE inbox_aggregate
SET gap_since    = coalesce(gap_since, clock_timestamp()),
    resync_after = coalesce(resync_after, clock_timestamp() + make_interval(secs => @window_seconds::float8)),
    updated_at   = clock_timestamp()
WHERE aggregate_type = @aggregate_type AND aggregate_id = @aggregate_id;

-- name: InboxAggregateResyncNow :exec
-- An event arrived for a version a snapshot placed: it is held, and the
-- source of truth is asked at once whether it wrote it.
UPDATE inbox_aggregate
SET gap_since    = coalesce(gap_since, clock_timestamp()),
    resync_after = clock_timestamp(),
    updated_at   = clock_timestamp()
WHERE aggregate_type = @aggregate_type AND aggregate_id = @aggregate_id;

-- name: InboxAggregateDiverge :exec
-- A conflict at @version: the producer's history forked at or before it.
-- Later versions are held from now on, and a resync is due at once.
UPDATE inbox_aggregate
SET diverged_at   = coalesce(diverged_at, clock_timestamp()),
    diverged_from = least(coalesce(diverged_from, @version::bigint), @version::bigint),
    gap_since     = coalesce(gap_since, clock_timestamp()),
    resync_after  = clock_timestamp(),
    updated_at    = clock_timestamp()
WHERE aggregate_type = @aggregate_type AND aggregate_id = @aggregate_id;

-- name: InboxAggregateRebase :exec
-- After a diverged aggregate's resync: local state is the snapshot's, at its
-- version, which may be below the version the lost history had reached.
UPDATE inbox_aggregate
SET last_version = @new_version, diverged_at = NULL, diverged_from = NULL, updated_at = clock_timestamp()
WHERE aggregate_type = @aggregate_type AND aggregate_id = @aggregate_id;

-- name: ProcessedEventFork :execrows
-- The events applied here from the lost history, from the fork point on,
-- stop owning their versions (they still deduplicate their event_ids).
UPDATE processed_event
SET outcome = 'forked'
WHERE aggregate_type = @aggregate_type AND aggregate_id = @aggregate_id
  AND aggregate_version >= @from_version
  AND outcome IN ('applied', 'superseded', 'covered');

-- name: InboxAggregateCloseGap :exec
UPDATE inbox_aggregate
SET gap_since = NULL, resync_after = NULL, resync_attempts = 0, last_resync_error = NULL,
    updated_at = clock_timestamp()
WHERE aggregate_type = @aggregate_type AND aggregate_id = @aggregate_id;

-- name: InboxAggregateResyncFailed :exec
-- Pushes the next resync attempt out; the gap stays open and held events stay held.
UPDATE inbox_aggregate
SET resync_after      = clock_timestamp() + make_interval(secs => @retry_seconds::float8),
    resync_attempts   = resync_attempts + 1,
    last_resync_error = left(@last_error::text, 1024),
    updated_at        = clock_timestamp()
WHERE aggregate_type = @aggregate_type AND aggregate_id = @aggregate_id;

-- name: InboxGapsDue :many
-- Aggregates whose gap outlived its window, the most overdue first. now(),
-- not clock_timestamp(): a stable bound is an index condition, so the scan
-- of inbox_aggregate_resync_due_idx stops at the first gap not yet due
-- instead of filtering every scheduled one.
SELECT * FROM inbox_aggregate
WHERE resync_after <= now()
ORDER BY resync_after
LIMIT @row_limit;

-- name: InboxGapsOverdueCount :one
-- Aggregates whose gap is older than the window, whether or not a resync is
-- scheduled: a failed or stale resync pushes resync_after forward, but the
-- gap is still unresolved and must keep alerting.
SELECT count(*) FROM inbox_aggregate
WHERE gap_since <= clock_timestamp() - make_interval(secs => @window_seconds::float8);

-- name: ProcessedEventInsert :one
-- The dedup marker. No row comes back when the event_id is already known:
-- the caller treats that as a duplicate and changes nothing.
INSERT INTO processed_event (event_id, aggregate_type, aggregate_id, aggregate_version, event_type, outcome)
VALUES (@event_id, @aggregate_type, @aggregate_id, @aggregate_version, @event_type, @outcome)
ON CONFLICT (event_id) DO NOTHING
RETURNING event_id;

-- name: ProcessedEventGet :one
SELECT * FROM processed_event WHERE event_id = @event_id;

-- name: ProcessedEventOwner :one
-- The event that owns an aggregate version, if any. Conflict rows never own
-- a version; superseded and covered ones do (a snapshot placed their state).
SELECT event_id FROM processed_event
WHERE aggregate_type = @aggregate_type AND aggregate_id = @aggregate_id
  AND aggregate_version = @aggregate_version
  AND outcome IN ('applied', 'superseded', 'covered')
LIMIT 1;

-- name: ProcessedEventSetOutcome :exec
UPDATE processed_event
SET outcome = @outcome, processed_at = clock_timestamp()
WHERE event_id = @event_id;

-- name: CleanupLock :one
-- One cleaner at a time for a whole run (O6): a session-level advisory lock
-- on a connection the run holds. A crashed cleaner's session ends and
-- releases it.
SELECT pg_try_advisory_lock(@lock_key::bigint);

-- name: CleanupUnlock :one
SELECT pg_advisory_unlock(@lock_key::bigint);

-- name: ProcessedEventCleanup :one
-- Deletes one bounded batch of finished markers older than the TTL, oldest
-- first, so a large backlog never becomes one long lock-holding statement.
-- The cutoff uses now(), not clock_timestamp(): a volatile function cannot
-- bound an index scan, and the run's last batch, which finds fewer rows
-- than its limit, would walk the whole index and its heap to prove it.
--
-- It returns how many markers it deleted and the last one's
-- (processed_at, event_id), in the index's order: the cursor the next
-- batch seeks past in processed_event_cleanup_idx. From the start of the
-- index, batch k would first step over the entries of the k-1 batches
-- before it, which stay in the index until the table is vacuumed, and a
-- run over a large backlog would take time quadratic in it. A marker that
-- becomes deletable behind the cursor while the run lasts (committed late,
-- or given a finished outcome) is deleted by the next run.
WITH gone AS (
    DELETE FROM processed_event
    WHERE event_id IN (
        SELECT p.event_id FROM processed_event p
        WHERE p.outcome IN ('applied', 'superseded', 'covered', 'conflict', 'forked')
          AND p.processed_at < now() - make_interval(secs => @ttl_seconds::float8)
          AND (p.processed_at, p.event_id) > (@after_processed_at::timestamptz, @after_event_id::uuid)
        ORDER BY p.processed_at, p.event_id
        LIMIT @batch_size
    )
    RETURNING processed_at, event_id
), last AS (
    SELECT g.processed_at, g.event_id FROM gone g
    ORDER BY g.processed_at DESC, g.event_id DESC
    LIMIT 1
)
SELECT (SELECT count(*) FROM gone)::bigint AS deleted,
       coalesce((SELECT l.processed_at FROM last l), @after_processed_at::timestamptz)::timestamptz AS last_processed_at,
       coalesce((SELECT l.event_id FROM last l), @after_event_id::uuid)::uuid AS last_event_id;

-- name: InboxHeldInsert :exec
INSERT INTO inbox_held_event (event_id, aggregate_type, aggregate_id, aggregate_version,
                              event_type, schema_version, event_time, payload)
VALUES (@event_id, @aggregate_type, @aggregate_id, @aggregate_version,
        @event_type, @schema_version, @event_time, @payload);

-- name: InboxHeldGetByVersion :one
-- The held or parked event that owns a version; a rejected one owns none.
SELECT * FROM inbox_held_event
WHERE aggregate_type = @aggregate_type AND aggregate_id = @aggregate_id
  AND aggregate_version = @aggregate_version AND state <> 'rejected';

-- name: InboxHeldGet :one
-- Every change to a held event happens under its aggregate's lock, which
-- the caller takes after this read and before reading again.
SELECT * FROM inbox_held_event WHERE event_id = @event_id;

-- name: InboxHeldRowHash :one
-- The row as JSON, hashed, for an operator's audit trail (after
-- InboxRowHashSettings).
SELECT sha256(convert_to(to_jsonb(h)::text, 'UTF8'))::bytea AS row_sha256
FROM inbox_held_event h WHERE event_id = @event_id;

-- name: InboxHeldReject :one
-- The source of truth does not own this event at its version, or an
-- operator dropped it: it gives its version up and is kept, with the
-- reason, for an operator to see.
UPDATE inbox_held_event
SET state = 'rejected', park_reason = left(@reason::text, 1024), parked_at = clock_timestamp(),
    rejected_by = sqlc.narg('actor')
WHERE event_id = @event_id AND state <> 'rejected'
RETURNING *;

-- name: InboxHeldNext :one
-- The held event that directly follows the applied version, if it arrived.
SELECT * FROM inbox_held_event
WHERE aggregate_type = @aggregate_type AND aggregate_id = @aggregate_id
  AND aggregate_version = @aggregate_version AND state = 'held';

-- name: InboxHeldDelete :exec
DELETE FROM inbox_held_event WHERE event_id = @event_id;

-- name: InboxHeldCountForAggregate :one
SELECT count(*) FROM inbox_held_event
WHERE aggregate_type = @aggregate_type AND aggregate_id = @aggregate_id AND state = 'held';

-- name: InboxHeldTakeCovered :many
-- A resync snapshot already covers these versions: they leave the hold
-- without their state change; the caller marks them superseded and hands
-- each to the consumer's Covered function, in version order.
DELETE FROM inbox_held_event h
WHERE h.aggregate_type = @aggregate_type AND h.aggregate_id = @aggregate_id
  AND h.state = 'held' AND h.aggregate_version <= @snapshot_version
RETURNING *;

-- name: InboxHeldParkAll :many
-- The source of truth cannot place these events (for instance it answered
-- 404): they are kept with the reason for an operator, never dropped.
UPDATE inbox_held_event h
SET state = 'parked', park_reason = left(@reason::text, 1024), parked_at = clock_timestamp()
WHERE h.aggregate_type = @aggregate_type AND h.aggregate_id = @aggregate_id AND h.state = 'held'
RETURNING *;

-- name: InboxHeldParkOne :execrows
-- A held event whose change failed when its turn came: parked on its own,
-- so the event that released it is not rolled back with it.
UPDATE inbox_held_event
SET state = 'parked', park_reason = left(@reason::text, 1024), parked_at = clock_timestamp()
WHERE event_id = @event_id AND state = 'held';

-- name: InboxHeldListForAggregate :many
SELECT * FROM inbox_held_event
WHERE aggregate_type = @aggregate_type AND aggregate_id = @aggregate_id
ORDER BY aggregate_version;

-- name: InboxHeldStats :one
SELECT count(*) FILTER (WHERE state = 'held')   AS held,
       count(*) FILTER (WHERE state IN ('parked', 'rejected')) AS parked
FROM inbox_held_event;

-- name: InboxConflictInsert :exec
INSERT INTO inbox_conflict (event_id, aggregate_type, aggregate_id, aggregate_version,
                            event_type, existing_event_id, payload, schema_version, event_time)
VALUES (@event_id, @aggregate_type, @aggregate_id, @aggregate_version,
        @event_type, @existing_event_id, @payload, @schema_version, @event_time);

-- name: InboxConflictPending :many
-- The aggregate's conflicts that wait for the source of truth's word.
SELECT * FROM inbox_conflict
WHERE aggregate_type = @aggregate_type AND aggregate_id = @aggregate_id AND resolution IS NULL
ORDER BY aggregate_version, detected_at;

-- name: InboxConflictResolve :exec
UPDATE inbox_conflict
SET resolution = @resolution::text, resolved_at = clock_timestamp()
WHERE event_id = @event_id;

-- name: ProcessedEventOwnersFrom :many
-- The events that own the aggregate's versions from @from_version on: the
-- local history a conflict put in doubt.
SELECT event_id, aggregate_version FROM processed_event
WHERE aggregate_type = @aggregate_type AND aggregate_id = @aggregate_id
  AND aggregate_version >= @from_version
  AND outcome IN ('applied', 'superseded', 'covered');

-- name: InboxAggregateUndiverge :exec
-- The source of truth confirmed the local history: the conflicting events
-- were impostors, and nothing forked.
UPDATE inbox_aggregate
SET diverged_at = NULL, diverged_from = NULL, updated_at = clock_timestamp()
WHERE aggregate_type = @aggregate_type AND aggregate_id = @aggregate_id;

-- name: InboxConflictList :many
SELECT * FROM inbox_conflict
WHERE aggregate_type = @aggregate_type AND aggregate_id = @aggregate_id
ORDER BY aggregate_version, detected_at;

-- name: InboxParkedRecordInsert :execrows
-- A redelivered poison record (same key, same content) is parked once; see
-- the migration for why the content hash is part of the identity.
INSERT INTO inbox_parked_record (source, partition, "offset", event_id, park_key, record_sha256,
                                 record_key, record_value, headers, reason)
VALUES (@source, @partition, @record_offset, sqlc.narg('event_id'), @park_key, @record_sha256,
        @record_key, @record_value, @headers, left(@reason::text, 1024))
ON CONFLICT (park_key, record_sha256) DO NOTHING;

-- name: InboxParkedRecordCount :one
-- Open parked records, from their partial index (inbox_parked_record_open_idx):
-- resolved ones are history, not work.
SELECT count(*) FROM inbox_parked_record WHERE resolution IS NULL OR resolution = 'still_failing';

-- name: InboxParkedRecordList :many
SELECT * FROM inbox_parked_record ORDER BY id LIMIT @row_limit;

-- name: InboxParkedRecordListSummary :many
-- Parked records for an operator, oldest first from a cursor, without their
-- key, value and headers. Open ones only, unless include_resolved.
SELECT id, source, partition, "offset", event_id, reason, parked_at,
       resolution, retry_outcome, resolved_by, resolved_at, retries
FROM inbox_parked_record
WHERE id > @after_id
  AND (@include_resolved::boolean OR resolution IS NULL OR resolution = 'still_failing')
ORDER BY id
LIMIT @row_limit;

-- name: InboxParkedRecordGet :one
SELECT * FROM inbox_parked_record WHERE id = @id;

-- name: InboxRowHashSettings :exec
-- Row hashes (sha256 of to_jsonb(row)) depend on how timestamps and bytes
-- print; fixed for the rest of the transaction, so they do not depend on
-- the session and anyone can recompute them.
SELECT set_config('TimeZone', 'UTC', true), set_config('bytea_output', 'hex', true);

-- name: InboxParkedRecordLock :one
-- The record to retry, locked until the transaction ends (two retries of
-- one record run one after the other), with the hash of the row.
SELECT sqlc.embed(p), sha256(convert_to(to_jsonb(p)::text, 'UTF8'))::bytea AS row_sha256
FROM inbox_parked_record p
WHERE p.id = @id
FOR UPDATE;

-- name: InboxParkedRecordResolve :one
-- Records what a retry did, and by whom. A record that still fails keeps
-- its row, with the new reason.
UPDATE inbox_parked_record p
SET resolution      = @resolution::text,
    retry_outcome   = sqlc.narg('retry_outcome')::text,
    reason          = coalesce(left(sqlc.narg('new_reason')::text, 1024), p.reason),
    resolved_by     = @resolved_by::text,
    resolved_at     = clock_timestamp(),
    resolution_note = left(@note::text, 1024),
    retries         = p.retries + 1
WHERE p.id = @id
RETURNING sha256(convert_to(to_jsonb(p)::text, 'UTF8'))::bytea AS row_sha256;

-- name: InboxHeldParkedList :many
-- Held events parked (a resync could not place them, or their change
-- failed), oldest first, without their payloads.
SELECT event_id, aggregate_type, aggregate_id, aggregate_version, event_type, schema_version,
       event_time, park_reason, held_at, parked_at, state, rejected_by
FROM inbox_held_event
WHERE state IN ('parked', 'rejected')
ORDER BY parked_at, event_id
LIMIT @row_limit;

-- name: InboxHeldWaitingList :many
-- Events still held for an earlier version, oldest first, without their
-- payloads: what an operator may drop.
SELECT event_id, aggregate_type, aggregate_id, aggregate_version, event_type, schema_version,
       event_time, held_at
FROM inbox_held_event
WHERE state = 'held'
ORDER BY held_at, event_id
LIMIT @row_limit;

-- name: InboxConflictListAll :many
-- Conflicts, oldest first, without their payloads.
SELECT event_id, aggregate_type, aggregate_id, aggregate_version, event_type, existing_event_id, detected_at,
       resolution, resolved_at
FROM inbox_conflict
ORDER BY detected_at, event_id
LIMIT @row_limit;

-- The set-based path of ProcessBatch: one statement for a whole batch
-- instead of one per event. The arrays are parallel, one element per event
-- or per aggregate (several set-returning functions in one select list
-- advance together, row by row), sorted by the caller so that concurrent
-- batches take their row locks in the same order.

-- name: InboxAggregateEnsureMany :exec
INSERT INTO inbox_aggregate (aggregate_type, aggregate_id)
SELECT unnest(@aggregate_types::text[]), unnest(@aggregate_ids::text[])
ON CONFLICT (aggregate_type, aggregate_id) DO NOTHING;

-- name: InboxAggregateLockMany :many
-- Locks the batch's aggregates in key order and reads what decides whether
-- an event may take the set-based path: the applied version, an open gap,
-- a forked history, and whether anything is held or parked for it.
SELECT a.aggregate_type, a.aggregate_id, a.last_version,
       (a.gap_since IS NOT NULL OR a.diverged_at IS NOT NULL
        OR EXISTS (SELECT 1 FROM inbox_held_event h
                   WHERE h.aggregate_type = a.aggregate_type AND h.aggregate_id = a.aggregate_id))::boolean AS unusual
FROM inbox_aggregate a
JOIN (SELECT unnest(@aggregate_types::text[]) AS aggregate_type, unnest(@aggregate_ids::text[]) AS aggregate_id) u
  ON a.aggregate_type = u.aggregate_type AND a.aggregate_id = u.aggregate_id
ORDER BY a.aggregate_type, a.aggregate_id
FOR UPDATE OF a;

-- name: ProcessedEventDeleteMany :exec
-- Takes back markers this transaction has just inserted (ProcessBatch, when
-- one event_id of the batch turned out to be known).
DELETE FROM processed_event WHERE event_id = ANY(@event_ids::uuid[]);

-- name: ProcessedEventInsertMany :many
-- The dedup markers of a batch, all 'applied'. An event_id that is already
-- known returns no row, exactly as ProcessedEventInsert; the caller checks
-- that every marker was new.
INSERT INTO processed_event (event_id, aggregate_type, aggregate_id, aggregate_version, event_type, outcome)
SELECT unnest(@event_ids::uuid[]), unnest(@aggregate_types::text[]), unnest(@aggregate_ids::text[]),
       unnest(@aggregate_versions::bigint[]), unnest(@event_types::text[]), 'applied'
ON CONFLICT (event_id) DO NOTHING
RETURNING event_id;

-- name: InboxAggregateAdvanceMany :execrows
-- Moves each aggregate to its new version, never backwards, as
-- InboxAggregateAdvance does for one.
UPDATE inbox_aggregate a
SET last_version = u.new_version, updated_at = clock_timestamp()
FROM (SELECT unnest(@aggregate_types::text[]) AS aggregate_type, unnest(@aggregate_ids::text[]) AS aggregate_id,
             unnest(@new_versions::bigint[]) AS new_version) u
WHERE a.aggregate_type = u.aggregate_type AND a.aggregate_id = u.aggregate_id
  AND a.last_version < u.new_version;
