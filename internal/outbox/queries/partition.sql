-- The relays' ownership of the aggregates' partitions (R1-R3, R9). Each
-- relay runs these in one short transaction every poll interval (at most
-- every quarter of its lease): it says it is alive, renews what it owns,
-- works out its fair share, and gives back or takes partitions to reach
-- it. See migration 00008 for the tables.

-- name: RelayHeartbeat :one
-- Records that the relay is alive until now + lease, forgets relays whose
-- heartbeat has expired, and returns how many relays are alive (this one
-- included) and how many partitions there are. The forgetting skips rows
-- another transaction holds: two relays whose heartbeats both expired
-- (a long database outage) would otherwise each wait for the other's
-- heartbeat row, a deadlock.
WITH beat AS (
    INSERT INTO outbox_relay (owner, expires_at)
    VALUES (@owner::text, now() + make_interval(secs => @lease_seconds::double precision))
    ON CONFLICT (owner) DO UPDATE SET expires_at = excluded.expires_at
), gone AS (
    DELETE FROM outbox_relay
    WHERE owner IN (SELECT r.owner
                    FROM outbox_relay r
                    WHERE r.expires_at <= now() AND r.owner <> @owner::text
                    FOR UPDATE SKIP LOCKED)
)
SELECT (SELECT count(*) FROM outbox_relay r WHERE r.expires_at > now() AND r.owner <> @owner::text)::integer + 1 AS live,
       (SELECT count(*) FROM outbox_relay_partition)::integer AS partitions;

-- name: RelayPartitionsRenew :many
-- Extends the lease of every partition the relay still owns, expired or
-- not: a partition nobody else took meanwhile is still the relay's at the
-- same epoch, and nothing was sent by anyone else. A partition taken over
-- is not returned. A takeover locks the row first (FOR UPDATE in
-- RelayPartitionsAcquire), so this update waits for it, sees the new owner
-- and leaves the row alone.
UPDATE outbox_relay_partition
SET lease_expires_at = now() + make_interval(secs => @lease_seconds::double precision)
WHERE owner = @owner::text
RETURNING partition, epoch;

-- name: RelayPartitionsAcquire :many
-- Takes up to max_partitions free or expired partitions, each under a new
-- epoch. SKIP LOCKED: relays acquiring at the same time take disjoint
-- partitions, and a partition whose lease row a confirm holds FOR SHARE
-- is skipped until the next attempt, after that confirm.
WITH free AS (
    SELECT p.partition
    FROM outbox_relay_partition p
    WHERE p.owner IS NULL OR p.lease_expires_at <= now()
    ORDER BY p.partition
    LIMIT @max_partitions::integer
    FOR UPDATE SKIP LOCKED
)
UPDATE outbox_relay_partition p
SET owner            = @owner::text,
    epoch            = p.epoch + 1,
    lease_expires_at = now() + make_interval(secs => @lease_seconds::double precision)
FROM free
WHERE p.partition = free.partition
RETURNING p.partition, p.epoch;

-- name: RelayPartitionsGiveBack :many
-- Gives partitions back so that other relays can take them at once: the
-- ones above the relay's fair share, or all of them when it stops (R9).
-- The relay calls it only when none of its events in these partitions is
-- in flight. The epoch stays; the next owner increments it.
UPDATE outbox_relay_partition
SET owner = NULL, lease_expires_at = NULL
WHERE owner = @owner::text
  AND partition = ANY (@partitions::integer[])
RETURNING partition;

-- name: RelayStop :exec
-- A relay that stops gracefully leaves the live set (R9), so that the
-- others' fair share grows at once.
DELETE FROM outbox_relay WHERE owner = @owner::text;
