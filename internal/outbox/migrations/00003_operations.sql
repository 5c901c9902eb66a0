-- +goose Up
-- What operating the outbox needs (O4-O6): an audit trail of every
-- operator's write, replay plans and their history per event, and an
-- archive that keeps the identity and broker position of delivered rows
-- after the retention cleanup has deleted them.

-- Every write an operator makes through the admin tools: who, why, when,
-- and what the row looked like before and after (hashes of the row's JSON,
-- so the audit proves what changed without copying payloads around).
CREATE TABLE outbox_audit (
    id            bigint      GENERATED ALWAYS AS IDENTITY PRIMARY KEY,
    at            timestamptz NOT NULL DEFAULT clock_timestamp(),
    actor         text        NOT NULL CHECK (actor <> ''),
    action        text        NOT NULL,
    -- The event id, plan id or event type acted on.
    target        text        NOT NULL,
    reason        text        NOT NULL CHECK (reason <> '' AND length(reason) <= 1024),
    before_sha256 bytea,
    after_sha256  bytea,
    -- What the action changed, beyond the hashes (for instance the new
    -- schema version); never a payload.
    detail        jsonb       NOT NULL DEFAULT '{}'
);
CREATE INDEX outbox_audit_target_idx ON outbox_audit (target, at);

-- A replay: re-publishing events that are still in the outbox, with their
-- original event_id, key and headers (O5). A plan is written first and
-- publishes nothing; large and time-range plans need a second admin's
-- approval before they run.
CREATE TABLE outbox_replay_plan (
    id             uuid        PRIMARY KEY,
    created_at     timestamptz NOT NULL DEFAULT clock_timestamp(),
    created_by     text        NOT NULL,
    reason         text        NOT NULL CHECK (reason <> '' AND length(reason) <= 1024),
    -- How the events were chosen: {"ids": [...]} or {"from", "to", "type"}.
    selector       jsonb       NOT NULL,
    needs_approval boolean     NOT NULL,
    approved_by    text,
    approved_at    timestamptz,
    status         text        NOT NULL DEFAULT 'planned'
                               CHECK (status IN ('planned', 'approved', 'running', 'done', 'failed')),
    run_by         text,
    run_started_at timestamptz,
    run_ended_at   timestamptz,
    run_error      text        CHECK (length(run_error) <= 1024),
    CONSTRAINT outbox_replay_plan_second_approver CHECK (approved_by IS NULL OR approved_by <> created_by)
);

-- The events of a plan and what became of each: still in the outbox and
-- to be published, skipped because the cleanup archived it, or published
-- (with where the broker put the copy). This is each event's replay history.
CREATE TABLE outbox_replay_item (
    plan_id          uuid        NOT NULL REFERENCES outbox_replay_plan (id) ON DELETE CASCADE,
    event_id         uuid        NOT NULL,
    event_type       text        NOT NULL,
    created_at       timestamptz NOT NULL,
    state            text        NOT NULL CHECK (state IN ('planned', 'skipped_archived', 'published')),
    published_at     timestamptz,
    broker_partition integer,
    broker_offset    bigint,
    PRIMARY KEY (plan_id, event_id)
);
CREATE INDEX outbox_replay_item_event_idx ON outbox_replay_item (event_id);

-- Delivered rows past their retention: identity and broker position stay
-- (to answer "was event X published, and where?"), the payload goes.
CREATE TABLE outbox_archive (
    event_id          uuid        PRIMARY KEY,
    aggregate_type    text        NOT NULL,
    aggregate_id      text        NOT NULL,
    aggregate_version bigint      NOT NULL,
    event_type        text        NOT NULL,
    schema_version    integer     NOT NULL,
    created_at        timestamptz NOT NULL,
    delivered_at      timestamptz,
    broker_partition  integer,
    broker_offset     bigint,
    archived_at       timestamptz NOT NULL DEFAULT clock_timestamp()
);

-- The cleanup walks delivered rows oldest first; the index holds only them.
CREATE INDEX outbox_delivered_cleanup_idx ON outbox (delivered_at, event_id)
    WHERE state = 'delivered';
