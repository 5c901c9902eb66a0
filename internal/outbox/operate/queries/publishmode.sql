-- Publish-mode migration (O7), the operator's side: the modes and the
-- shadow report.

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
