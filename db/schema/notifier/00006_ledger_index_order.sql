-- +goose NO TRANSACTION
-- +goose Up
-- The sender's claim, its stale-email skip and the ledger cleanup each read
-- the rows they act on straight from an index, in the order they want,
-- whatever the planner's statistics say: a backlog arrives faster than
-- autovacuum's next ANALYZE, and a claim planned on statistics from before
-- the burst would otherwise read and sort every due row to send one email,
-- O(backlog) per email and O(backlog²) to drain it (59 ms per claim at
-- 50,000 due rows, measured).
--
-- email_send_due_idx held pending and unknown rows by next_attempt_at
-- alone: the claim's tie-breaker (operation_key) needed a sort, and unknown
-- rows held for an operator (EMAIL_UNKNOWN_POLICY=hold), due since the
-- moment they became unknown, sat in front of every due row. Each state now
-- has an index in the claim's exact order, (next_attempt_at,
-- operation_key); the claim walks the pending one, and the unknown one only
-- under the resend policy, and stops at its first row. A sender with
-- several workers filters each worker's share of the orders on top of that
-- walk: about as many rows read per claim as there are workers.
--
-- Never-attempted pending rows by event time let the stale-email skip
-- (EMAIL_MAX_AGE) read only the rows it skips.
--
-- CONCURRENTLY, outside a transaction, so writes to a large ledger go on
-- while the indexes are built. Each build is preceded by a drop of the same
-- name: a build that failed half way leaves an invalid index behind, and a
-- second run of this file then starts it again instead of keeping it.
DROP INDEX CONCURRENTLY IF EXISTS email_send_pending_due_idx;
CREATE INDEX CONCURRENTLY email_send_pending_due_idx ON email_send (next_attempt_at, operation_key)
    WHERE state = 'pending';

DROP INDEX CONCURRENTLY IF EXISTS email_send_unknown_due_idx;
CREATE INDEX CONCURRENTLY email_send_unknown_due_idx ON email_send (next_attempt_at, operation_key)
    WHERE state = 'unknown';

DROP INDEX CONCURRENTLY IF EXISTS email_send_never_attempted_idx;
CREATE INDEX CONCURRENTLY email_send_never_attempted_idx ON email_send (event_time)
    WHERE state = 'pending' AND attempts = 0;

DROP INDEX CONCURRENTLY IF EXISTS email_send_due_idx;
