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
--
-- one_round_trip is set when the statement is part of a batch sent outside
-- any explicit transaction (Writer.QueueOneTrip): the batch commits before
-- the direct path could act, so an event type in direct or shadow mode
-- makes the statement raise (outbox_needs_transaction, migration 00009)
-- and the whole batch roll back.
INSERT INTO outbox (event_id, aggregate_type, aggregate_id, aggregate_version,
                    event_type, schema_version, payload, traceparent, tracestate,
                    publish_mode, state, delivered_at)
SELECT e.event_id, e.aggregate_type, e.aggregate_id, e.aggregate_version,
       e.event_type, e.schema_version, e.payload,
       -- '' stands for "no trace context": pgx cannot send NULL inside text[] from []string.
       nullif(e.traceparent, ''), nullif(e.tracestate, ''),
       CASE WHEN m.mode IS NULL THEN 'outbox'
            WHEN @one_round_trip::boolean THEN outbox_needs_transaction(e.event_type, m.mode)
            ELSE m.mode END,
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

-- name: OutboxRead :many
-- Reads up to batch_size due events of the partitions the relay owns (R1).
-- A plain SELECT: nothing is written until the confirm. The relay owns each
-- of these partitions alone, so no other relay reads these rows; the
-- epoch in the confirm's fence is what makes a read under a lost
-- partition harmless (R2). in_flight lists the events the relay is still
-- sending, read by the previous batch and not yet settled; they are still
-- pending, and reading them again would send them twice. The relay lists
-- only those due at or after read_floor, the only ones this read can reach
-- (claim.go, readFrom): each row the read walks is compared with every id
-- in the list.
--
-- Due: pending, next_attempt_at reached (backoff is stored in the row, so
-- it holds for every relay, R4), and not leased per row by a relay of the
-- previous version, which still uses lease_owner, lease_token and
-- lease_expires_at while relays are upgraded.
--
-- Strict ordering (R6): an event whose type is not listed as independent is
-- read only when no earlier version of its aggregate is undelivered,
-- whatever the state of that earlier row: pending (in flight, or backing
-- off after a failure) or parked. Unknown types count as strict, the safe
-- side. At most one strict version per aggregate is in flight at any time,
-- and a relay that lost a partition without knowing it yet cannot send a
-- version whose predecessor is not delivered. The guard only reads.
--
-- A version 1 has no earlier version (the column's CHECK), so it skips the
-- lookup: aggregates are often created and changed in quick succession, and
-- a read may see as many first versions as later ones.
--
-- Order is explicit (R6): due time, then age, then aggregate version. For
-- rows that never failed next_attempt_at is their insert time, so this is
-- oldest first; it matches outbox_pending_due_idx and stops early under a
-- LIMIT. The partitions of other relays are filtered on the way, so a read
-- walks about as many index entries as the batch times the number of live
-- relays. Within an aggregate the strict guard, not this order, decides.
--
-- read_floor is where the walk starts (OutboxReadFloor, below): no pending
-- row of these partitions is due earlier. Without it each read would first
-- step over every row delivered since the table was last vacuumed, whose
-- entries stay in the index until then.
SELECT o.event_id, o.aggregate_type, o.aggregate_id, o.aggregate_version,
       o.event_type, o.schema_version, o.payload, o.traceparent, o.tracestate, o.created_at,
       o.attempts, o.next_attempt_at, o.publish_mode, o.relay_partition
FROM outbox o
WHERE o.state = 'pending'
  AND o.next_attempt_at <= now()
  AND o.next_attempt_at >= @read_floor::timestamptz
  AND o.relay_partition = ANY (@partitions::integer[])
  AND NOT (o.event_id = ANY (@in_flight::uuid[]))
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
LIMIT @batch_size::integer;

-- name: OutboxReadFloor :one
-- Where the relay's reads start in outbox_pending_due_idx: the earliest
-- next_attempt_at of a pending row in the partitions, or late_seconds
-- ago if that is earlier. A confirm leaves its rows' old entries in the
-- index until the table is next vacuumed, and autovacuum waits for a
-- fifth of the table to be dead: an outbox that keeps its delivered rows
-- for replay may hold millions of them, and a read from the start of the
-- index would step over each one, every time. The relay runs this once
-- per upkeep (about a second) and reads from the floor until the next.
--
-- A row that becomes pending later is due at or after the floor when it
-- is a release (now() plus backoff), a repair (clock_timestamp()) or an
-- insert committed within late_seconds of being written. An insert in a
-- transaction that stayed open longer after writing it may lie below the
-- floor: it is read once the next upkeep moves the floor down to it. It is
-- late by at most one upkeep, never lost, and strict order does not depend
-- on the floor (the guard looks at the earlier versions themselves).
--
-- The walk to the first pending row is the cost the reads no longer pay:
-- once per upkeep instead of once per batch. It runs in index order like
-- the read (ClaimInIndexOrder).
SELECT least(
           coalesce((SELECT o.next_attempt_at
                     FROM outbox o
                     WHERE o.state = 'pending'
                       AND o.relay_partition = ANY (@partitions::integer[])
                     ORDER BY o.next_attempt_at, o.created_at, o.aggregate_version
                     LIMIT 1), 'infinity'),
           now() - make_interval(secs => @late_seconds::double precision))::timestamptz AS read_floor;

-- name: OutboxConfirm :many
-- Marks events delivered after the broker acknowledged them (R2), in one
-- statement for the whole batch: the one row write each event costs.
--
-- The fence: fence_partitions and fence_epochs are the partitions of the
-- batch with the epoch each had when the relay read its rows. A row is
-- updated only if its partition still has this owner at that epoch. The
-- lease rows are locked FOR SHARE in the same statement, and a relay that
-- takes a partition over updates its lease row, so the two serialize: a
-- takeover that committed first makes the lock see the new epoch and the
-- confirm match nothing; a confirm that locked first commits before the
-- new owner reads a row. A relay that lost a partition can therefore
-- neither mark the new owner's sends delivered nor overwrite their
-- partition and offset. Rows that are not returned were lost; the caller
-- logs and counts them and never retries. Partition and offset are for
-- tracing only, never a version.
--
-- The rows are found by primary key, one lookup per id, however many rows
-- are pending. That is why the state is compared with the batch's
-- from_state rather than with the literal 'pending': a join condition
-- cannot select the partial pending index, while a literal lets the
-- planner walk every pending row through it, for each id of the batch,
-- whenever its statistics (taken while few rows were pending) say there
-- are a handful. Under a burst that made each confirm slower as the
-- backlog grew, and the backlog grow as the confirms slowed. The caller
-- also plans each execution afresh (outboxdb.RelaxedCommit), so that a
-- plan made while the table was tiny is not kept as it grows.
-- plan_test.go, TestConfirmPlansForTheTableAsItIs, checks both.
WITH fence AS (
    SELECT p.partition
    FROM outbox_relay_partition p
    JOIN (SELECT unnest(@fence_partitions::integer[]) AS partition,
                 unnest(@fence_epochs::bigint[])      AS epoch) f
      ON f.partition = p.partition AND f.epoch = p.epoch
    WHERE p.owner = @owner::text
    FOR SHARE OF p
)
UPDATE outbox o
SET state            = 'delivered',
    broker_partition = d.broker_partition,
    broker_offset    = d.broker_offset,
    delivered_at     = now()
FROM (SELECT unnest(@event_ids::uuid[])        AS event_id,
             unnest(@partitions::integer[])    AS broker_partition,
             unnest(@offsets::bigint[])        AS broker_offset,
             'pending'::text                   AS from_state) d
WHERE o.event_id = d.event_id
  AND o.state = d.from_state
  AND o.relay_partition IN (SELECT partition FROM fence)
RETURNING o.event_id;

-- name: OutboxRelease :many
-- Writes down what happened to events that were not acknowledged, in one
-- statement for the whole batch, fenced by the partition epoch like the
-- confirm. Every release counts one attempt.
--   * a transient failure (unknown outcome, R3) stays pending with the
--     retry bookkeeping of R4: error class, bounded text, and
--     next_attempt_at pushed out by the caller's backoff;
--   * a deterministic failure (R5) is parked with its reason;
--   * a relay stopping (R9) records the stop with no delay, so the next
--     owner of the partition sends the event at once.
-- last_error is cut to the CHECK's 1024 characters here as well as in Go.
-- The rows are found by primary key, as the confirm's are, and for the
-- same reason (OutboxConfirm): a broker outage leaves many rows pending,
-- and each release must not walk them all.
WITH fence AS (
    SELECT p.partition
    FROM outbox_relay_partition p
    JOIN (SELECT unnest(@fence_partitions::integer[]) AS partition,
                 unnest(@fence_epochs::bigint[])      AS epoch) f
      ON f.partition = p.partition AND f.epoch = p.epoch
    WHERE p.owner = @owner::text
    FOR SHARE OF p
)
UPDATE outbox o
SET state            = r.state,
    attempts         = o.attempts + 1,
    last_error_class = r.error_class,
    last_error       = left(r.error_text, 1024),
    next_attempt_at  = now() + make_interval(secs => r.delay_seconds)
FROM (SELECT unnest(@event_ids::uuid[])            AS event_id,
             unnest(@states::text[])               AS state,
             unnest(@error_classes::text[])        AS error_class,
             unnest(@error_texts::text[])          AS error_text,
             unnest(@delays_seconds::double precision[]) AS delay_seconds,
             'pending'::text                       AS from_state) r
WHERE o.event_id = r.event_id
  AND o.state = r.from_state
  AND o.relay_partition IN (SELECT partition FROM fence)
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
-- visible), counted by the parked head's event type. Starts from the
-- parked rows (outbox_parked_idx), never from the backlog, which is
-- largest when this gauge matters. A parked row is its aggregate's head
-- when no earlier version is parked; if a later parked row holds back a
-- pending one, so does the head. The two lookups per parked row use the
-- aggregate's unique key, with the states compared with subqueries' values:
-- a literal would let the planner walk every undelivered row through the
-- partial index whenever its statistics say there are none
-- (TestBlockedGaugeReadsTheParkedRows).
SELECT p.event_type, count(*)::bigint AS blocked
FROM outbox p
WHERE p.state = 'parked'
  AND NOT EXISTS (SELECT 1
                  FROM outbox e
                  WHERE e.aggregate_type = p.aggregate_type
                    AND e.aggregate_id = p.aggregate_id
                    AND e.aggregate_version < p.aggregate_version
                    AND e.state = (SELECT 'parked'::text))
  AND EXISTS (SELECT 1
              FROM outbox l
              WHERE l.aggregate_type = p.aggregate_type
                AND l.aggregate_id = p.aggregate_id
                AND l.aggregate_version > p.aggregate_version
                AND l.state = (SELECT 'pending'::text)
                AND NOT (l.event_type = ANY (@independent_types::text[])))
GROUP BY p.event_type;
