-- +goose Up
-- The W3C tracestate that goes with traceparent (L4): vendor-specific trace
-- data, carried to the record's tracestate header unchanged. NULL when the
-- writer's context had none. Bounded like the header the consumer accepts
-- (cloudevents.MaxTracestateBytes), so a row the relay sends is a record
-- the consumer keeps whole.
ALTER TABLE outbox
    ADD COLUMN tracestate text CHECK (length(tracestate) <= 512);
