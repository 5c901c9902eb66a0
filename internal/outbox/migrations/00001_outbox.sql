-- +goose Up
-- The transactional outbox (W3). Rows are inserted in the business
-- transaction and delivered by the relay (R1-R6). Column names are a
-- contract: the docs, the runbook and outside checks use them.
CREATE TABLE outbox (
    -- Identity, fixed in the business transaction and never regenerated.
    event_id          uuid        PRIMARY KEY,
    aggregate_type    text        NOT NULL,
    aggregate_id      text        NOT NULL,
    aggregate_version bigint      NOT NULL CHECK (aggregate_version >= 1),
    event_type        text        NOT NULL,
    schema_version    integer     NOT NULL CHECK (schema_version >= 1),
    payload           jsonb       NOT NULL,
    traceparent       text,
    created_at        timestamptz NOT NULL DEFAULT clock_timestamp(),

    -- Delivery state.
    state             text        NOT NULL DEFAULT 'pending'
                                  CHECK (state IN ('pending', 'delivered', 'parked')),

    -- Lease written by the claim transaction; the token fences the confirm (R2).
    lease_owner       text,
    lease_token       uuid,
    lease_expires_at  timestamptz,

    -- Retry bookkeeping (R4), stored in the row so backoff holds cluster-wide.
    attempts          integer     NOT NULL DEFAULT 0,
    next_attempt_at   timestamptz NOT NULL DEFAULT clock_timestamp(),
    last_error_class  text,
    last_error        text CHECK (length(last_error) <= 1024),

    -- Where the broker put it, for tracing only (never a version).
    broker_partition  integer,
    broker_offset     bigint,
    delivered_at      timestamptz,

    CONSTRAINT outbox_aggregate_version_key UNIQUE (aggregate_type, aggregate_id, aggregate_version)
);

-- The claim query's index: only undelivered rows, in due order. Delivered
-- rows (the vast majority over time) are not in it, so it stays small.
CREATE INDEX outbox_pending_due_idx ON outbox (next_attempt_at, created_at)
    WHERE state = 'pending';

-- Strict ordering looks up earlier undelivered versions of one aggregate;
-- parked rows are few and are listed by the operations tooling.
CREATE INDEX outbox_undelivered_aggregate_idx ON outbox (aggregate_type, aggregate_id, aggregate_version)
    WHERE state <> 'delivered';
