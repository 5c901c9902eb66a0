-- The direct path of the publish-mode migration (O7): the Writer's log of
-- what the direct path sent, and the relay's shadow comparison against it.
-- The modes themselves are set by the operations (operate/queries).

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
-- Settles the shadow rows of one read: nothing was sent by the relay, the
-- direct path did it. Each row becomes delivered at the broker position the
-- direct path logged, fenced by the partition epoch like a confirm
-- (OutboxConfirm), and the comparison's result goes to the log (a row with
-- only the result when the direct path logged nothing). Rows not returned
-- were lost to another relay, which compares them again. The rows are
-- found by primary key, for the reasons the confirm's are (OutboxConfirm):
-- the state is compared with a column of the batch, never with the
-- literal, and the caller plans each execution afresh
-- (outboxdb.ShadowSettleCustomPlan).
WITH fence AS (
    SELECT p.partition
    FROM outbox_relay_partition p
    JOIN (SELECT unnest(@fence_partitions::integer[]) AS partition,
                 unnest(@fence_epochs::bigint[])      AS epoch) f
      ON f.partition = p.partition AND f.epoch = p.epoch
    WHERE p.owner = @owner::text
    FOR SHARE OF p
), r AS (
    SELECT unnest(@event_ids::uuid[]) AS event_id,
           unnest(@event_types::text[]) AS event_type,
           unnest(@results::text[]) AS result,
           unnest(@details::text[]) AS detail,
           'pending'::text AS from_state
), done AS (
    UPDATE outbox o
    SET state            = 'delivered',
        delivered_at     = now(),
        broker_partition = l.broker_partition,
        broker_offset    = l.broker_offset
    FROM r LEFT JOIN outbox_direct_log l ON l.event_id = r.event_id
    WHERE o.event_id = r.event_id
      AND o.state = r.from_state
      AND o.relay_partition IN (SELECT partition FROM fence)
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
