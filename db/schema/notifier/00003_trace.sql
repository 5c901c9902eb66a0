-- +goose Up
-- The trace context of the record that asked for the email (L4). The sender
-- runs later, outside the consumer's transaction; with the context stored in
-- the ledger row its send span continues the event's trace, and the email's
-- X-Trace-Id header is derived from the row, so a resend is the same email
-- byte for byte. NULL when the record carried none (or the event was held
-- and applied later: held events keep no trace context). Bounded like the
-- record headers the consumer accepts.
ALTER TABLE email_send
    ADD COLUMN traceparent text CHECK (length(traceparent) <= 55),
    ADD COLUMN tracestate  text CHECK (length(tracestate) <= 512);
