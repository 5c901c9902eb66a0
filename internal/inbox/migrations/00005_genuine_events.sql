-- +goose Up
-- Only the producer's genuine events take a place in an aggregate's
-- sequence (C7). A consumer that has a source of truth to ask settles every
-- doubt with it: two events at one version (a conflict), or a held event
-- that may never become due. What the source does not own is rejected: it
-- keeps its marker (a redelivery is a duplicate) and its bytes (for an
-- operator), but it no longer holds a version.

-- 'rejected': the source of truth does not know the event at its version
-- (an impostor, or a version beyond any the source has), or an operator
-- dropped it. A rejected event gives its version up, so the genuine event
-- of that version can still be held.
ALTER TABLE inbox_held_event DROP CONSTRAINT inbox_held_event_state_check;
ALTER TABLE inbox_held_event ADD CONSTRAINT inbox_held_event_state_check
    CHECK (state IN ('held', 'parked', 'rejected'));
ALTER TABLE inbox_held_event DROP CONSTRAINT inbox_held_event_version_key;
CREATE UNIQUE INDEX inbox_held_event_version_key
    ON inbox_held_event (aggregate_type, aggregate_id, aggregate_version)
    WHERE state <> 'rejected';
-- Who dropped a held event through the admin API; NULL when the resync
-- rejected it.
ALTER TABLE inbox_held_event ADD COLUMN rejected_by text;

ALTER TABLE processed_event DROP CONSTRAINT processed_event_outcome_check;
ALTER TABLE processed_event ADD CONSTRAINT processed_event_outcome_check
    CHECK (outcome IN ('applied', 'held', 'superseded', 'covered', 'conflict', 'parked', 'forked', 'rejected'));

-- A conflict waits for the source of truth: 'genuine' when the newcomer is
-- the source's event at the version (its effects then run once, as for a
-- covered event), 'impostor' when it is not, 'unverified' when the source
-- could not say (the conflict is then only recorded, as before). The event's
-- schema version and time are kept so a genuine newcomer can be handled
-- like any other event.
ALTER TABLE inbox_conflict
    ADD COLUMN resolution     text CHECK (resolution IN ('genuine', 'impostor', 'unverified')),
    ADD COLUMN resolved_at    timestamptz,
    ADD COLUMN schema_version integer,
    ADD COLUMN event_time     timestamptz;
CREATE INDEX inbox_conflict_pending_idx ON inbox_conflict (aggregate_type, aggregate_id, aggregate_version)
    WHERE resolution IS NULL;
