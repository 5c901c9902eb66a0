-- +goose Up
-- Two changes for hostile input and late events.
--
-- 1. 'covered': an event whose version a resync snapshot had already placed
--    arrives late (or was held and then covered). Its state change never
--    runs, but it is recorded, owns its version, and its own effects (a
--    notification) may still run. Covered markers expire like applied ones.
ALTER TABLE processed_event DROP CONSTRAINT processed_event_outcome_check;
ALTER TABLE processed_event ADD CONSTRAINT processed_event_outcome_check
    CHECK (outcome IN ('applied', 'held', 'superseded', 'covered', 'conflict', 'parked'));

DROP INDEX processed_event_cleanup_idx;
CREATE INDEX processed_event_cleanup_idx ON processed_event (processed_at, event_id)
    WHERE outcome IN ('applied', 'superseded', 'covered', 'conflict');

-- 2. Parked records are stored losslessly whatever bytes they hold: key and
--    value as bytea, headers as JSON whose keys and values are text only
--    when PostgreSQL can store them as such (valid UTF-8 without NUL) and
--    base64 otherwise, and a reason cleaned of such bytes. A record is
--    identified by its event_id when it has a readable one, by its topic
--    position otherwise, together with a hash of its content: a redelivery
--    of the same record is stored once, while a different record is never
--    hidden behind an id or an offset seen before (a recreated topic reuses
--    offsets; a hostile record may reuse an id).
ALTER TABLE inbox_parked_record
    ALTER COLUMN event_id TYPE uuid USING (
        CASE WHEN event_id ~* '^[0-9a-f]{8}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{12}$' THEN event_id::uuid END),
    ADD COLUMN park_key      text,
    ADD COLUMN record_sha256 bytea;
UPDATE inbox_parked_record
SET park_key      = coalesce('event:' || event_id::text, 'position:' || source || '/' || partition || '@' || "offset"),
    record_sha256 = sha256(convert_to(id::text, 'UTF8'));
ALTER TABLE inbox_parked_record
    ALTER COLUMN park_key SET NOT NULL,
    ALTER COLUMN record_sha256 SET NOT NULL,
    DROP CONSTRAINT inbox_parked_record_position_key,
    ADD CONSTRAINT inbox_parked_record_identity_key UNIQUE (park_key, record_sha256);
