-- Publish-mode migration (O7): the modes, the direct path's log and the
-- relay's shadow comparison.

-- name: PublishModes :many
SELECT * FROM outbox_publish_mode ORDER BY event_type;

-- name: PublishModeLock :one
-- The current mode of one type, locked so that two operators switching it
-- at once are serialised. No row means outbox mode.
SELECT coalesce((SELECT mode FROM outbox_publish_mode WHERE event_type = @event_type FOR UPDATE), 'outbox')::text;

-- name: PublishModeSet :exec
INSERT INTO outbox_publish_mode (event_type, mode, changed_by)
VALUES (@event_type, @mode, @changed_by)
ON CONFLICT (event_type) DO UPDATE
SET mode = excluded.mode, changed_at = clock_timestamp(), changed_by = excluded.changed_by;

-- name: PublishModeClear :exec
-- Back to outbox mode, the default: the row goes, the audit keeps it.
DELETE FROM outbox_publish_mode WHERE event_type = @event_type;

-- name: DirectLogInsert :exec
-- What the direct path sent, written in the business transaction right
-- after the sends.
INSERT INTO outbox_direct_log (event_id, event_type, publish_mode, topic,
                               key_sha256, value_sha256, headers,
                               broker_partition, broker_offset)
SELECT unnest(@event_ids::uuid[]), unnest(@event_types::text[]), unnest(@modes::text[]),
       unnest(@topics::text[]), unnest(@key_sha256s::bytea[]), unnest(@value_sha256s::bytea[]),
       unnest(@headers::jsonb[]), unnest(@partitions::integer[]), unnest(@offsets::bigint[]);

-- name: DirectLogForEvents :many
-- The direct path's log of the shadow rows a relay claimed.
SELECT event_id, topic, key_sha256, value_sha256, headers, broker_partition, broker_offset
FROM outbox_direct_log
WHERE event_id = ANY (@event_ids::uuid[]);

-- name: ShadowSettle :many
-- Settles the shadow rows of one claim: nothing was sent by the relay, the
-- direct path did it. Each row becomes delivered at the broker position the
-- direct path logged, fenced by the lease token like a confirm, and the
-- comparison's result goes to the log (a row with only the result when the
-- direct path logged nothing). Rows not returned were lost to another
-- relay, which compares them again.
WITH r AS (
    SELECT unnest(@event_ids::uuid[]) AS event_id,
           unnest(@event_types::text[]) AS event_type,
           unnest(@results::text[]) AS result,
           unnest(@details::text[]) AS detail
), done AS (
    UPDATE outbox o
    SET state            = 'delivered',
        delivered_at     = now(),
        broker_partition = l.broker_partition,
        broker_offset    = l.broker_offset,
        lease_owner      = NULL,
        lease_token      = NULL,
        lease_expires_at = NULL
    FROM r LEFT JOIN outbox_direct_log l ON l.event_id = r.event_id
    WHERE o.event_id = r.event_id
      AND o.lease_token = @lease_token::uuid
      AND o.state = 'pending'
    RETURNING o.event_id
), logged AS (
    INSERT INTO outbox_direct_log (event_id, event_type, publish_mode, shadow_result, shadow_detail, shadow_at)
    SELECT r.event_id, r.event_type, 'shadow', r.result, left(nullif(r.detail, ''), 1024), now()
    FROM r JOIN done ON done.event_id = r.event_id
    ON CONFLICT (event_id) DO UPDATE
    SET shadow_result = excluded.shadow_result,
        shadow_detail = excluded.shadow_detail,
        shadow_at     = excluded.shadow_at
)
SELECT event_id FROM done;

-- name: ShadowReportCounts :many
-- Shadow comparisons since a time, by event type and result; 'pending'
-- counts events the relay has not compared yet.
SELECT event_type, coalesce(shadow_result, 'pending')::text AS result, count(*)::bigint AS n
FROM outbox_direct_log
WHERE publish_mode = 'shadow' AND sent_at >= @since
  AND (sqlc.narg('event_type')::text IS NULL OR event_type = sqlc.narg('event_type'))
GROUP BY 1, 2
ORDER BY 1, 2;

-- name: ShadowReportDiffs :many
-- The latest mismatched or missing events, with what differed.
SELECT event_id, event_type, sent_at, shadow_result::text AS result, coalesce(shadow_detail, '')::text AS detail
FROM outbox_direct_log
WHERE publish_mode = 'shadow' AND sent_at >= @since
  AND shadow_result IN ('mismatch', 'missing')
  AND (sqlc.narg('event_type')::text IS NULL OR event_type = sqlc.narg('event_type'))
ORDER BY sent_at DESC
LIMIT @row_limit;

-- name: DirectLogCleanup :execrows
-- The direct path's log older than the retention, one batch, oldest first.
-- The batch's rows are deleted by their physical address (ctid), read from
-- outbox_direct_log_sent_idx: a join back on event_id can be planned as a
-- scan of the whole log when the statistics are old.
DELETE FROM outbox_direct_log
WHERE ctid = ANY (ARRAY(SELECT d.ctid FROM outbox_direct_log d
                        WHERE d.sent_at < @sent_before::timestamptz
                        ORDER BY d.sent_at LIMIT @batch_size::integer));
