-- +goose Up
-- The notifier's own state: a projection of each order, and the send ledger
-- that is the notifier's outbox for email (C4).

-- What the notifier knows about an order, built only from events and resync
-- snapshots. version is the aggregate version the row reflects; it only
-- ever moves forward.
CREATE TABLE order_projection (
    order_id               uuid        PRIMARY KEY,
    email                  text        NOT NULL,
    status                 text        NOT NULL CHECK (status IN ('placed', 'paid', 'shipped', 'cancelled')),
    currency               text,
    total_cents            bigint,
    refund_requested_cents bigint,
    version                bigint      NOT NULL CHECK (version >= 1),
    -- The event that produced this state; NULL when a snapshot did.
    last_event_id          uuid,
    updated_at             timestamptz NOT NULL DEFAULT clock_timestamp()
);

-- The send ledger. A row is written in the event's transaction (the intent)
-- and sent later by the sender, outside any transaction. The operation key
-- and the Message-ID both derive from event_id, so a redelivered event finds
-- the row it already wrote instead of creating a second email.
CREATE TABLE email_send (
    operation_key    text        PRIMARY KEY,
    event_id         uuid        NOT NULL UNIQUE,
    message_id       text        NOT NULL UNIQUE,
    order_id         uuid        NOT NULL,
    event_type       text        NOT NULL,
    recipient        text        NOT NULL,
    subject          text        NOT NULL,
    body             text        NOT NULL,
    -- pending -> sending -> sent; sending -> unknown when the outcome was
    -- lost (connection dropped after DATA, or a sender died mid-send);
    -- failed is parked: a permanent refusal or too many attempts.
    state            text        NOT NULL DEFAULT 'pending'
                                 CHECK (state IN ('pending', 'sending', 'sent', 'unknown', 'failed')),
    attempts         integer     NOT NULL DEFAULT 0,
    next_attempt_at  timestamptz NOT NULL DEFAULT clock_timestamp(),
    -- The claim; the token fences the result update so a sender that lost
    -- its claim cannot overwrite a newer attempt.
    claim_token      uuid,
    claimed_by       text,
    sending_since    timestamptz,
    last_error_class text,
    last_error       text        CHECK (length(last_error) <= 1024),
    smtp_reply       text        CHECK (length(smtp_reply) <= 1024),
    created_at       timestamptz NOT NULL DEFAULT clock_timestamp(),
    sent_at          timestamptz,
    -- Operator resolution of unknown or failed rows (who and what).
    resolved_by      text,
    resolved_at      timestamptz,
    resolution       text
);

-- The sender's claim query: due rows only.
CREATE INDEX email_send_due_idx ON email_send (next_attempt_at)
    WHERE state IN ('pending', 'unknown');

-- Retention cleanup of sent emails, oldest first.
CREATE INDEX email_send_sent_cleanup_idx ON email_send (created_at, operation_key)
    WHERE state = 'sent';

-- The stuck-send sweep.
CREATE INDEX email_send_sending_idx ON email_send (sending_since)
    WHERE state = 'sending';
