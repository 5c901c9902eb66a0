-- +goose Up
-- Idempotency keys are kept for IDEMPOTENCY_KEY_RETENTION: long enough for
-- every client retry, not for ever. The cleanup walks them oldest first.
CREATE INDEX idempotency_keys_created_idx ON idempotency_keys (created_at, customer, key);
