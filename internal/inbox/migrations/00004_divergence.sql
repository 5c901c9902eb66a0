-- +goose Up
-- A conflict means the producer's history of an aggregate forked from the
-- one applied here: typically the producer's database was restored from a
-- backup and wrote new events under versions this consumer already applied
-- from the lost history. Applying the producer's later versions on top of
-- the lost history would merge two histories silently, so the aggregate is
-- marked diverged: later versions are held, and a resync from the source of
-- truth replaces the local state (when the consumer has a Fetch function).
--
-- diverged_from is the lowest conflicting version: the fork point.
ALTER TABLE inbox_aggregate
    ADD COLUMN diverged_at   timestamptz,
    ADD COLUMN diverged_from bigint CHECK (diverged_from >= 1);

-- 'forked': an event applied here from the history the producer no longer
-- has. After the resync its marker still recognises a redelivery of it as a
-- duplicate, but it no longer owns its version: the producer's event of that
-- version is not a conflict with it. Forked markers expire like the others.
ALTER TABLE processed_event DROP CONSTRAINT processed_event_outcome_check;
ALTER TABLE processed_event ADD CONSTRAINT processed_event_outcome_check
    CHECK (outcome IN ('applied', 'held', 'superseded', 'covered', 'conflict', 'parked', 'forked'));

DROP INDEX processed_event_cleanup_idx;
CREATE INDEX processed_event_cleanup_idx ON processed_event (processed_at, event_id)
    WHERE outcome IN ('applied', 'superseded', 'covered', 'conflict', 'forked');
