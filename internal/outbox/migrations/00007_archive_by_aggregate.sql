-- +goose Up
-- A consumer that finds two events claiming one version, or holds an event
-- the producer may never have written, asks which event_id the outbox wrote
-- at each version of the aggregate (OutboxEventsOfAggregate). The outbox
-- answers from its unique (aggregate_type, aggregate_id, aggregate_version)
-- index; the archive needs one too, or the question would scan every
-- delivered event ever archived.
CREATE INDEX outbox_archive_aggregate_idx ON outbox_archive (aggregate_type, aggregate_id, aggregate_version);

