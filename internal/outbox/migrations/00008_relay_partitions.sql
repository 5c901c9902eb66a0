-- +goose Up
-- Relays own partitions of the aggregates instead of leasing rows (R1-R3,
-- R6). Until now every event cost two row writes: the claim's lease, then
-- the confirm. Now a relay reads the due rows of the partitions it owns
-- with a plain SELECT and writes each row once, when it marks it
-- delivered; the confirm is fenced by the partition's epoch, which changes
-- whenever the partition changes owner, so a relay that lost a partition
-- can neither confirm nor reschedule its rows.
--
-- The per-row lease columns (lease_owner, lease_token, lease_expires_at)
-- stay: a relay of the previous version still writes them while relays
-- are upgraded one by one, and the relay skips rows such a relay holds.

-- The partition of an event: a hash of its aggregate, computed by the
-- database, so every relay agrees and the insert names no extra column.
-- hashtextextended is the function PostgreSQL's own hash partitioning of
-- text uses, which keeps its results across major versions for that very
-- reason. An aggregate never changes partition. 16 partitions: at most 16
-- relays share the work; the number is fixed here and in the rows of
-- outbox_relay_partition below, and changing it means a migration that
-- rewrites both while no relay runs.
--
-- Adding a stored generated column rewrites the table under an exclusive
-- lock: on a large outbox, run the retention cleanup first.
ALTER TABLE outbox
    ADD COLUMN relay_partition integer NOT NULL
        GENERATED ALWAYS AS ((hashtextextended(aggregate_type || '/' || aggregate_id, 0) & 15)::integer) STORED;

-- One row per partition. owner holds it until lease_expires_at (on the
-- database's clock) and renews it while it runs; a free or expired
-- partition is taken by the next relay that has less than its fair share,
-- with epoch + 1. A confirm, release or shadow settlement matches only
-- while the partition's owner and epoch are still those the relay read
-- its rows under.
CREATE TABLE outbox_relay_partition (
    partition        integer     PRIMARY KEY CHECK (partition BETWEEN 0 AND 15),
    owner            text,
    epoch            bigint      NOT NULL DEFAULT 0,
    lease_expires_at timestamptz,
    CONSTRAINT outbox_relay_partition_lease CHECK ((owner IS NULL) = (lease_expires_at IS NULL))
);
INSERT INTO outbox_relay_partition (partition) SELECT generate_series(0, 15);

-- The relays alive, each renewed with its partitions' leases: the fair
-- share of a relay is ceil(partitions / live relays), so a relay that has
-- just started and owns nothing yet still counts, and the others give
-- partitions back to it.
CREATE TABLE outbox_relay (
    owner      text        PRIMARY KEY,
    expires_at timestamptz NOT NULL
);
