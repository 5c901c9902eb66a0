-- name: OutboxInsert :many
-- Inserts all events of one command in one statement, inside the caller's
-- business transaction (W1). created_at and next_attempt_at take their
-- defaults.
--
-- The statement also reads each event type's publish mode (O7) and stores
-- it in the row: the Writer's direct path acts on the mode returned here
-- and the relay on the mode stored, so exactly one of them sends. A type
-- without a row in outbox_publish_mode is in outbox mode. A direct-mode
-- row is written delivered: the direct path sends it, the relay never does.
INSERT INTO outbox (event_id, aggregate_type, aggregate_id, aggregate_version,
                    event_type, schema_version, payload, traceparent, tracestate,
                    publish_mode, state, delivered_at)
SELECT e.event_id, e.aggregate_type, e.aggregate_id, e.aggregate_version,
       e.event_type, e.schema_version, e.payload,
       -- '' stands for "no trace context": pgx cannot send NULL inside text[] from []string.
       nullif(e.traceparent, ''), nullif(e.tracestate, ''),
       coalesce(m.mode, 'outbox'),
       CASE WHEN m.mode = 'direct' THEN 'delivered' ELSE 'pending' END,
       CASE WHEN m.mode = 'direct' THEN clock_timestamp() END
FROM (SELECT unnest(@event_ids::uuid[])          AS event_id,
             unnest(@aggregate_types::text[])     AS aggregate_type,
             unnest(@aggregate_ids::text[])       AS aggregate_id,
             unnest(@aggregate_versions::bigint[]) AS aggregate_version,
             unnest(@event_types::text[])         AS event_type,
             unnest(@schema_versions::integer[])  AS schema_version,
             unnest(@payloads::jsonb[])           AS payload,
             unnest(@traceparents::text[])        AS traceparent,
             unnest(@tracestates::text[])         AS tracestate) e
LEFT JOIN outbox_publish_mode m ON m.event_type = e.event_type
RETURNING event_id, publish_mode, created_at;

-- name: OutboxClaim :many
-- Leases up to batch_size due events to one relay in a short transaction
-- (R1). SKIP LOCKED lets N relays claim disjoint rows without waiting on
-- each other; the lease (owner, fresh token, expiry) is what makes the claim
-- survive the commit, so no lock is held while the relay talks to the broker.
--
-- Due: pending, next_attempt_at reached (backoff is stored in the row, so it
-- holds for every relay, R4), and not leased or the lease expired (the
-- holder crashed or stalled, R3).
--
-- Strict ordering (R6): an event whose type is not listed as independent is
-- claimable only when no earlier version of its aggregate is undelivered,
-- whatever the state of that earlier row: pending, leased by anyone (even
-- with an expired lease) or parked. Unknown types count as strict, the safe
-- side. At most one strict version per aggregate is in flight at any time.
--
-- A version 1 has no earlier version (the column's CHECK), so it skips the
-- lookup: aggregates are often created and changed in quick succession, and
-- a claim may see as many first versions as later ones.
--
-- Order is explicit (R6): due time, then age, then aggregate version. For
-- rows that never failed next_attempt_at is their insert time, so this is
-- oldest first; it matches outbox_pending_due_idx and stops early under a
-- LIMIT. Within an aggregate the strict guard, not this order, decides.
WITH due AS (
    SELECT o.event_id
    FROM outbox o
    WHERE o.state = 'pending'
      AND o.next_attempt_at <= now()
      AND (o.lease_expires_at IS NULL OR o.lease_expires_at <= now())
      AND (o.event_type = ANY (@independent_types::text[])
           OR o.aggregate_version = 1
           OR NOT EXISTS (
               SELECT 1
               FROM outbox e
               WHERE e.aggregate_type = o.aggregate_type
                 AND e.aggregate_id = o.aggregate_id
                 AND e.aggregate_version < o.aggregate_version
                 AND e.state <> 'delivered'))
    ORDER BY o.next_attempt_at, o.created_at, o.aggregate_version
    LIMIT @batch_size::integer
    FOR UPDATE OF o SKIP LOCKED
)
UPDATE outbox o
SET lease_owner      = @lease_owner::text,
    lease_token      = @lease_token::uuid,
    lease_expires_at = now() + make_interval(secs => @lease_seconds::double precision)
FROM due
WHERE o.event_id = due.event_id
RETURNING o.event_id, o.aggregate_type, o.aggregate_id, o.aggregate_version,
          o.event_type, o.schema_version, o.payload, o.traceparent, o.tracestate, o.created_at,
          o.attempts, o.next_attempt_at, o.lease_expires_at::timestamptz AS lease_expires_at,
          o.publish_mode;

-- name: OutboxConfirm :many
-- Marks events delivered after the broker acknowledged them (R2), in one
-- statement for the whole batch. The lease token fences the update: a relay
-- whose lease expired and whose rows were claimed again holds a stale token
-- and matches nothing, so it can neither mark the successor's claim
-- delivered nor overwrite its partition and offset. Rows that are not
-- returned were lost; the caller logs and counts them and never retries.
-- Partition and offset are for tracing only, never a version.
UPDATE outbox o
SET state            = 'delivered',
    broker_partition = d.broker_partition,
    broker_offset    = d.broker_offset,
    delivered_at     = now(),
    lease_owner      = NULL,
    lease_token      = NULL,
    lease_expires_at = NULL
FROM (SELECT unnest(@event_ids::uuid[])        AS event_id,
             unnest(@partitions::integer[])    AS broker_partition,
             unnest(@offsets::bigint[])        AS broker_offset) d
WHERE o.event_id = d.event_id
  AND o.lease_token = @lease_token::uuid
  AND o.state = 'pending'
RETURNING o.event_id;

-- name: OutboxRelease :many
-- Gives leased events back after anything but an acknowledgement, in one
-- statement for the whole batch, fenced by the lease token like the confirm.
-- Every release counts one attempt.
--   * a transient failure (unknown outcome, R3) stays pending with the
--     retry bookkeeping of R4: error class, bounded text, and
--     next_attempt_at pushed out by the caller's backoff;
--   * a deterministic failure (R5) is parked with its reason;
--   * a relay stopping (R9) releases with no delay so a successor can claim
--     at once instead of waiting for the lease to expire.
-- last_error is cut to the CHECK's 1024 characters here as well as in Go.
UPDATE outbox o
SET state            = r.state,
    attempts         = o.attempts + 1,
    last_error_class = r.error_class,
    last_error       = left(r.error_text, 1024),
    next_attempt_at  = now() + make_interval(secs => r.delay_seconds),
    lease_owner      = NULL,
    lease_token      = NULL,
    lease_expires_at = NULL
FROM (SELECT unnest(@event_ids::uuid[])            AS event_id,
             unnest(@states::text[])               AS state,
             unnest(@error_classes::text[])        AS error_class,
             unnest(@error_texts::text[])          AS error_text,
             unnest(@delays_seconds::double precision[]) AS delay_seconds) r
WHERE o.event_id = r.event_id
  AND o.lease_token = @lease_token::uuid
  AND o.state = 'pending'
RETURNING o.event_id;

-- name: OutboxStats :many
-- Backlog per event type for the metrics collector (O1): pending and
-- parked counts and the oldest pending event's commit time, from which the
-- collector computes the age at each scrape. Reads only undelivered rows,
-- through the partial index outbox_undelivered_aggregate_idx.
SELECT event_type,
       (count(*) FILTER (WHERE state = 'pending'))::bigint AS pending,
       (count(*) FILTER (WHERE state = 'parked'))::bigint  AS parked,
       -- The epoch stands for "none" when a type has only parked rows.
       coalesce(min(created_at) FILTER (WHERE state = 'pending'), 'epoch')::timestamptz AS oldest_pending
FROM outbox
WHERE state <> 'delivered'
GROUP BY event_type;

-- name: OutboxBlockedAggregates :many
-- Aggregates whose earliest parked event holds back at least one later
-- pending strict event (R6: a parked head blocks its aggregate and must be
-- visible), counted by the parked head's event type.
SELECT h.event_type, count(*)::bigint AS blocked
FROM (SELECT DISTINCT ON (p.aggregate_type, p.aggregate_id) p.event_type
      FROM outbox p
      WHERE p.state = 'parked'
        AND EXISTS (SELECT 1
                    FROM outbox l
                    WHERE l.aggregate_type = p.aggregate_type
                      AND l.aggregate_id = p.aggregate_id
                      AND l.aggregate_version > p.aggregate_version
                      AND l.state = 'pending'
                      AND NOT (l.event_type = ANY (@independent_types::text[])))
      ORDER BY p.aggregate_type, p.aggregate_id, p.aggregate_version) h
GROUP BY h.event_type;
