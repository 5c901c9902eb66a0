-- +goose Up
-- Migrating from "publish inside the transaction" to the outbox (O7). The
-- publish mode of an event type says which path sends its events:
--
--   direct  the legacy path sends from inside the business transaction (the
--           dual write being migrated away from); the row is written
--           already delivered and the relay never sends it;
--   shadow  the legacy path still sends; the relay builds the record it
--           would have sent, compares it with what the legacy path logged,
--           and sends nothing;
--   outbox  the relay sends; the legacy path is off.
--
-- The mode is read by the insert that writes the event, in the business
-- transaction, and stored in the row. The legacy path acts on the mode the
-- insert returned and the relay on the mode stored in the row, so each
-- event is sent by exactly one path, also while the mode switches.

-- An event type without a row is in outbox mode: new installs need none.
CREATE TABLE outbox_publish_mode (
    event_type text        PRIMARY KEY,
    mode       text        NOT NULL CHECK (mode IN ('direct', 'shadow')),
    changed_at timestamptz NOT NULL DEFAULT clock_timestamp(),
    changed_by text        NOT NULL
);

ALTER TABLE outbox
    ADD COLUMN publish_mode text NOT NULL DEFAULT 'outbox'
        CHECK (publish_mode IN ('direct', 'shadow', 'outbox'));

-- What the legacy path sent, one row per event, written in the business
-- transaction right after the send. Digests, not copies: the comparison
-- needs no payload. The value's digest is of its JSON with keys sorted and
-- no insignificant whitespace, as jsonb normalises what the relay sends. In shadow mode the relay fills in the comparison; when
-- it finds no row at all (the legacy path did not send an event it should
-- have), it writes one with only the result, 'missing'.
CREATE TABLE outbox_direct_log (
    event_id         uuid        PRIMARY KEY,
    event_type       text        NOT NULL,
    publish_mode     text        NOT NULL CHECK (publish_mode IN ('direct', 'shadow')),
    sent_at          timestamptz NOT NULL DEFAULT clock_timestamp(),
    topic            text,
    key_sha256       bytea,
    value_sha256     bytea,
    -- Each header's name and the SHA-256 of its value, hex.
    headers          jsonb,
    broker_partition integer,
    broker_offset    bigint,
    -- Shadow mode only: what the relay found when it compared.
    shadow_result    text        CHECK (shadow_result IN ('match', 'mismatch', 'missing')),
    shadow_detail    text        CHECK (length(shadow_detail) <= 1024),
    shadow_at        timestamptz
);
CREATE INDEX outbox_direct_log_sent_idx ON outbox_direct_log (sent_at);
