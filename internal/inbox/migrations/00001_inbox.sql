-- +goose Up
-- The inbox of the idempotent consumer (C2, C3, C6). Everything here is
-- written in the same local transaction as the business change, so the
-- inbox and the state it protects always agree (V4).

-- processed_event is the dedup marker: one row per event_id the consumer has
-- durably accounted for. Inserting it is what makes a later copy of the same
-- event a duplicate, so it must commit or roll back with the business change.
CREATE TABLE processed_event (
    event_id          uuid        PRIMARY KEY,
    aggregate_type    text        NOT NULL,
    aggregate_id      text        NOT NULL,
    aggregate_version bigint      NOT NULL CHECK (aggregate_version >= 1),
    event_type        text        NOT NULL,
    -- applied:    the business change ran.
    -- held:       waiting in inbox_held_event for an earlier version (gap).
    -- superseded: held, then covered by a resync snapshot; never applied.
    -- conflict:   another event_id already owns this aggregate version.
    -- parked:     held, then parked because the resync could not place it.
    outcome           text        NOT NULL
                                  CHECK (outcome IN ('applied', 'held', 'superseded', 'conflict', 'parked')),
    received_at       timestamptz NOT NULL DEFAULT clock_timestamp(),
    processed_at      timestamptz NOT NULL DEFAULT clock_timestamp()
);

-- Conflict detection looks up who owns an (aggregate, version).
CREATE INDEX processed_event_aggregate_version_idx
    ON processed_event (aggregate_type, aggregate_id, aggregate_version);

-- TTL cleanup walks rows by age in small batches (C5, O6). Held and parked
-- rows are never cleaned: their events are not finished yet.
CREATE INDEX processed_event_cleanup_idx ON processed_event (processed_at, event_id)
    WHERE outcome IN ('applied', 'superseded', 'conflict');

-- One row per aggregate: the highest version applied, and the gap state.
-- Locking this row (SELECT ... FOR UPDATE) serialises every decision about
-- one aggregate, so two consumers that briefly overlap after a rebalance
-- cannot both apply the same version.
CREATE TABLE inbox_aggregate (
    aggregate_type  text        NOT NULL,
    aggregate_id    text        NOT NULL,
    last_version    bigint      NOT NULL DEFAULT 0 CHECK (last_version >= 0),
    -- Set while events are held: when the gap opened and when it is due for
    -- a resync from the source of truth.
    gap_since       timestamptz,
    resync_after    timestamptz,
    resync_attempts integer     NOT NULL DEFAULT 0,
    last_resync_error text      CHECK (length(last_resync_error) <= 1024),
    updated_at      timestamptz NOT NULL DEFAULT clock_timestamp(),
    PRIMARY KEY (aggregate_type, aggregate_id)
);

CREATE INDEX inbox_aggregate_resync_due_idx ON inbox_aggregate (resync_after)
    WHERE resync_after IS NOT NULL;

-- Events that arrived ahead of a missing version. They are stored here
-- before the broker offset is committed, so a restart never loses them.
CREATE TABLE inbox_held_event (
    event_id          uuid        PRIMARY KEY REFERENCES processed_event (event_id),
    aggregate_type    text        NOT NULL,
    aggregate_id      text        NOT NULL,
    aggregate_version bigint      NOT NULL CHECK (aggregate_version >= 1),
    event_type        text        NOT NULL,
    schema_version    integer     NOT NULL,
    event_time        timestamptz NOT NULL,
    payload           bytea       NOT NULL,
    state             text        NOT NULL DEFAULT 'held' CHECK (state IN ('held', 'parked')),
    park_reason       text        CHECK (length(park_reason) <= 1024),
    held_at           timestamptz NOT NULL DEFAULT clock_timestamp(),
    parked_at         timestamptz,
    -- Two different events never wait for the same version: the second one
    -- is a conflict.
    CONSTRAINT inbox_held_event_version_key UNIQUE (aggregate_type, aggregate_id, aggregate_version)
);

-- Conflicts: a different event_id claimed an aggregate version that another
-- event already owns. Kept with the payload so an operator can compare the
-- two; never applied.
CREATE TABLE inbox_conflict (
    -- Cleaned up with its processed_event row when the TTL expires.
    event_id          uuid        PRIMARY KEY REFERENCES processed_event (event_id) ON DELETE CASCADE,
    aggregate_type    text        NOT NULL,
    aggregate_id      text        NOT NULL,
    aggregate_version bigint      NOT NULL,
    event_type        text        NOT NULL,
    existing_event_id uuid        NOT NULL,
    payload           bytea       NOT NULL,
    detected_at       timestamptz NOT NULL DEFAULT clock_timestamp()
);

-- Poison records (C6): what could not be decoded into an event at all, kept
-- raw so nothing vanishes. The (source, partition, offset) key makes a
-- redelivery of the same record after a crash park it only once.
CREATE TABLE inbox_parked_record (
    id          bigint      GENERATED ALWAYS AS IDENTITY PRIMARY KEY,
    source      text        NOT NULL,
    partition   integer     NOT NULL,
    "offset"    bigint      NOT NULL,
    event_id    text,
    record_key  bytea,
    record_value bytea,
    headers     jsonb       NOT NULL DEFAULT '[]',
    reason      text        NOT NULL CHECK (length(reason) <= 1024),
    parked_at   timestamptz NOT NULL DEFAULT clock_timestamp(),
    CONSTRAINT inbox_parked_record_position_key UNIQUE (source, partition, "offset")
);
