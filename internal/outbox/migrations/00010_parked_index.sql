-- +goose NO TRANSACTION
-- +goose Up
-- Parked events are few and rarely change, but everything an operator does
-- with them (list, group, resume, the blocked-aggregates gauge) asked for
-- state = 'parked', which only outbox_undelivered_aggregate_idx could
-- answer: each of those statements walked every pending row too, so under
-- the backlog of an outage, when operators look at parked events, each
-- read the whole backlog. A partial index of the parked rows alone answers
-- them. It costs the relay nothing: a row gets an entry only while it is
-- parked, and a pending or delivered row never is.
--
-- CONCURRENTLY, outside a transaction, as in 00006: business transactions
-- keep inserting while it is built, and a failed build leaves an invalid
-- index that the first statement of the next run drops.
DROP INDEX CONCURRENTLY IF EXISTS outbox_parked_idx;
CREATE INDEX CONCURRENTLY outbox_parked_idx ON outbox (created_at, event_id)
    WHERE state = 'parked';

-- +goose Down
DROP INDEX CONCURRENTLY IF EXISTS outbox_parked_idx;
