-- +goose Up
-- The ledger gauge counts skipped emails exactly, like the open states: an
-- estimate from the planner's statistics reads 0 until the table's first
-- ANALYZE, and a state too rare to be among the column's most common values
-- never shows, which is exactly when an operator looks for it (after a
-- restore, conflicting events' emails are skipped). Skipped rows are a small
-- part of the ledger; only sent stays an estimate.
CREATE INDEX email_send_counted_state_idx ON email_send (state)
    WHERE state IN ('pending', 'sending', 'unknown', 'failed', 'skipped');
DROP INDEX email_send_open_state_idx;
