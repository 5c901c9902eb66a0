-- +goose Up
-- Every emailing event gets exactly one ledger row and one final outcome
-- (C4a), whatever happened to the projection.
--
-- skipped: never sent, on purpose, with skip_reason: 'stale' (the event was
--          older than EMAIL_MAX_AGE when it could first be sent), 'conflict'
--          (another event owns its order version), 'not_found' (the orders
--          service does not know the order).
-- aggregate_version and event_time let an email that arrives after a later
-- one for the same order say so, and let the sender judge its age.
ALTER TABLE email_send DROP CONSTRAINT email_send_state_check;
ALTER TABLE email_send
    ADD CONSTRAINT email_send_state_check
        CHECK (state IN ('pending', 'sending', 'sent', 'unknown', 'failed', 'skipped')),
    ADD COLUMN aggregate_version bigint,
    ADD COLUMN event_time        timestamptz,
    ADD COLUMN skip_reason       text CHECK (length(skip_reason) <= 64),
    ADD CONSTRAINT email_send_skipped_has_reason CHECK ((state = 'skipped') = (skip_reason IS NOT NULL));

-- "Is there a later email for this order?"
CREATE INDEX email_send_order_version_idx ON email_send (order_id, aggregate_version);

-- Retention cleanup covers every finished row, oldest first.
DROP INDEX email_send_sent_cleanup_idx;
CREATE INDEX email_send_finished_cleanup_idx ON email_send (created_at, operation_key)
    WHERE state IN ('sent', 'skipped');
