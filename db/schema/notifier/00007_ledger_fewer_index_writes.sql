-- +goose NO TRANSACTION
-- +goose Up
-- Every email costs its ledger row an insert and two updates (claimed, then
-- its result), and neither update can be HOT: state decides the row's place
-- in the partial indexes, so each new row version gets an entry in every
-- index that holds it. With the sender the busiest writer of the notifier's
-- database, this file takes the entries nobody reads:
--
-- message_id: a second unique index on one identity. The Message-ID is
-- '<' || operation_key || '>' (internal/notify/email.go), so the primary
-- key already makes it unique; a check constraint now says so, at no
-- index entry per row version. event_id keeps its unique index: it is the
-- key the event journey and the operators look emails up by.
--
-- email_send_counted_state_idx held pending and sending too, the two states
-- every email passes through, only for the ledger gauge to count them;
-- email_send_pending_due_idx and email_send_sending_idx already hold
-- exactly those rows. The gauge's index now holds the states an email
-- ends in only by exception (unknown, failed, skipped).
--
-- Per email: 7 index entries for the insert, 6 for the claim and 5 for the
-- result before; 5, 4 and 4 after.
--
-- The check is added NOT VALID and then validated: existing rows are read
-- without blocking writes. The indexes are built and dropped CONCURRENTLY,
-- each build preceded by a drop of the same name, as in 00006; each step
-- may run again after a run that stopped half way.
ALTER TABLE email_send DROP CONSTRAINT IF EXISTS email_send_message_id_derived;
ALTER TABLE email_send
    ADD CONSTRAINT email_send_message_id_derived CHECK (message_id = '<' || operation_key || '>') NOT VALID;
ALTER TABLE email_send VALIDATE CONSTRAINT email_send_message_id_derived;
ALTER TABLE email_send DROP CONSTRAINT IF EXISTS email_send_message_id_key;

DROP INDEX CONCURRENTLY IF EXISTS email_send_rare_state_idx;
CREATE INDEX CONCURRENTLY email_send_rare_state_idx ON email_send (state)
    WHERE state IN ('unknown', 'failed', 'skipped');
DROP INDEX CONCURRENTLY IF EXISTS email_send_counted_state_idx;
