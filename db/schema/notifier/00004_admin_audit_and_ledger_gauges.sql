-- +goose Up
-- 1. The admin audit trail (O4, S1). Every write of the notifier's admin
--    API adds one row in the transaction of the change itself, so there is
--    never a change without its record, nor a record of a change that
--    rolled back: who (the bearer token's subject), what, on which row,
--    why (required), and the SHA-256 of the row's JSON before and after.
--    A hash is sha256(convert_to(to_jsonb(row)::text, 'UTF8')) computed
--    with TimeZone UTC and bytea_output hex, so anyone can recompute the
--    current one and compare it with the last after_sha256:
--
--      SET TimeZone = 'UTC';
--      SELECT encode(sha256(convert_to(to_jsonb(e)::text, 'UTF8')), 'hex')
--      FROM email_send e WHERE operation_key = '…';
--
--    It records operators' decisions: it is neither the event stream nor
--    an API (W8). detail holds identifiers and decisions, never payloads.
CREATE TABLE admin_audit (
    id            bigint      GENERATED ALWAYS AS IDENTITY PRIMARY KEY,
    at            timestamptz NOT NULL DEFAULT clock_timestamp(),
    actor         text        NOT NULL CHECK (actor <> '' AND length(actor) <= 256),
    action        text        NOT NULL CHECK (action <> '' AND length(action) <= 64),
    target        text        NOT NULL CHECK (target <> '' AND length(target) <= 512),
    reason        text        NOT NULL CHECK (btrim(reason) <> '' AND length(reason) <= 1024),
    before_sha256 bytea       NOT NULL CHECK (length(before_sha256) = 32),
    after_sha256  bytea       NOT NULL CHECK (length(after_sha256) = 32),
    detail        jsonb       NOT NULL DEFAULT '{}'
);

-- "What happened to this row?"
CREATE INDEX admin_audit_target_idx ON admin_audit (target, id);

-- 2. The ledger gauges, refreshed every few seconds, count the states still
--    to be acted on (by the sender or an operator) exactly, from this
--    index, instead of grouping the whole ledger; sent and skipped rows,
--    nearly all of it, are estimated from the planner's statistics.
CREATE INDEX email_send_open_state_idx ON email_send (state)
    WHERE state IN ('pending', 'sending', 'unknown', 'failed');
