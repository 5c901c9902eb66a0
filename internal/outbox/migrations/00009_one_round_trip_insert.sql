-- +goose Up
-- A command may send its business statements and its events' insert as one
-- batch outside any explicit transaction (Writer.QueueOneTrip): PostgreSQL
-- then runs the batch as one implicit transaction, committed when the batch
-- ends, so the whole command costs one round trip instead of three (BEGIN,
-- the batch, COMMIT). Such a batch commits before the caller sees what the
-- insert returned, so it cannot hold the transaction open for the direct
-- path of an event type in direct or shadow publish mode (O7). The insert
-- calls this function for such a type instead: it raises, the batch rolls
-- back whole, and the caller runs the command again in an explicit
-- transaction (outbox.NeedsTransaction says when). The SQLSTATE is the
-- outbox's own, so nothing else is mistaken for it.
-- +goose StatementBegin
CREATE FUNCTION outbox_needs_transaction(event_type text, mode text) RETURNS text
LANGUAGE plpgsql AS $$
BEGIN
    RAISE EXCEPTION 'outbox: event type % is in % publish mode, whose events must be written in an explicit transaction', event_type, mode
        USING ERRCODE = 'OB001';
END
$$;
-- +goose StatementEnd

-- +goose Down
DROP FUNCTION outbox_needs_transaction(text, text);
