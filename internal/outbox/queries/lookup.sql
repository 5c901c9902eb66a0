-- name: OutboxEventsOfAggregate :many
-- Every event the outbox wrote for one aggregate, by version: the rows
-- still in the outbox and the identities the retention cleanup archived.
-- This is what a consumer asks the source of truth when two events claim
-- one version, or when it holds an event the producer may never have
-- written (C7). UNION drops a row that is briefly in both tables while the
-- cleanup moves it.
SELECT o.event_id, o.aggregate_version, o.event_type
FROM outbox o
WHERE o.aggregate_type = @aggregate_type AND o.aggregate_id = @aggregate_id
UNION
SELECT a.event_id, a.aggregate_version, a.event_type
FROM outbox_archive a
WHERE a.aggregate_type = @aggregate_type AND a.aggregate_id = @aggregate_id
ORDER BY aggregate_version;
