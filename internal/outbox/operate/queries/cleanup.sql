-- The retention cleanup (O6): delivered rows to the archive, and the
-- direct path's log (O7), under one advisory lock per run.

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
          -- now(), not clock_timestamp(): a stable cutoff is an index
          -- condition, so the last batch stops at it instead of reading
          -- every delivered row still within the retention.
          AND d.delivered_at < now() - make_interval(secs => @retention_seconds::float8)
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

-- name: DirectLogCleanup :one
-- The direct path's log older than the retention, one batch, oldest first.
-- The batch's rows are deleted by their physical address (ctid), read from
-- outbox_direct_log_sent_idx: a join back on event_id can be planned as a
-- scan of the whole log when the statistics are old.
--
-- It returns how many rows it deleted and the latest sent_at among them:
-- the next batch starts there (sent_from), like ArchiveDelivered's cursor,
-- instead of stepping over the entries the batches before it deleted. The
-- index holds sent_at alone, so the bound is inclusive: rows sent in the
-- same microsecond as the last one deleted are read again, never skipped.
WITH gone AS (
    DELETE FROM outbox_direct_log
    WHERE ctid = ANY (ARRAY(SELECT d.ctid FROM outbox_direct_log d
                            WHERE d.sent_at < @sent_before::timestamptz
                              AND d.sent_at >= @sent_from::timestamptz
                            ORDER BY d.sent_at LIMIT @batch_size::integer))
    RETURNING sent_at
)
SELECT count(*)::bigint AS deleted,
       coalesce(max(sent_at), @sent_from::timestamptz)::timestamptz AS last_sent_at
FROM gone;
