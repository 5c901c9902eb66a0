-- +goose NO TRANSACTION
-- +goose Up
-- The claim orders due events by (next_attempt_at, created_at,
-- aggregate_version); outbox_pending_due_idx held the first two columns
-- only, so every claim needed a sort to break ties. It is rebuilt with all
-- three, under the same name (the queries' comments and the runbook name
-- it), so that the index alone gives the claim's order.
--
-- CONCURRENTLY, outside a transaction: business transactions keep
-- inserting into the outbox while the index is built. The new index is
-- built under a temporary name, the old one dropped, the new one renamed;
-- each step can be run again after a failure (a failed build leaves an
-- invalid index, dropped by the first statement of the next run).
DROP INDEX CONCURRENTLY IF EXISTS outbox_pending_due_next_idx;
CREATE INDEX CONCURRENTLY outbox_pending_due_next_idx ON outbox (next_attempt_at, created_at, aggregate_version)
    WHERE state = 'pending';
DROP INDEX CONCURRENTLY IF EXISTS outbox_pending_due_idx;
ALTER INDEX outbox_pending_due_next_idx RENAME TO outbox_pending_due_idx;
