-- +goose Up
-- Operating the inbox (O4, O6).
--
-- 1. An operator may retry a parked record (RetryParked): it is decoded and
--    processed again, in one transaction with the update below. The row is
--    kept either way, as the record of what was parked and what became of
--    it:
--      applied        the event went through the inbox and its change (or,
--                     covered by a snapshot, its effects) ran;
--      retried        the inbox took it without a change: a duplicate, a
--                     conflict, or held for a gap;
--      still_failing  it still cannot be processed: it stays parked, with
--                     the new reason, and may be retried again.
--    retry_outcome is the inbox's outcome of the retry that got through.
ALTER TABLE inbox_parked_record
    ADD COLUMN resolution      text CHECK (resolution IN ('applied', 'retried', 'still_failing')),
    ADD COLUMN retry_outcome   text CHECK (length(retry_outcome) <= 32),
    ADD COLUMN resolved_by     text CHECK (length(resolved_by) <= 256),
    ADD COLUMN resolved_at     timestamptz,
    ADD COLUMN resolution_note text CHECK (length(resolution_note) <= 1024),
    ADD COLUMN retries         integer NOT NULL DEFAULT 0,
    ADD CONSTRAINT inbox_parked_record_resolution_complete
        CHECK ((resolution IS NULL) = (resolved_at IS NULL) AND (resolution IS NULL) = (resolved_by IS NULL));

-- Open records (never retried, or still failing) are what the parked gauge
-- counts and what an operator works through; the resolved history grows
-- without bound, so neither reads it.
CREATE INDEX inbox_parked_record_open_idx ON inbox_parked_record (id)
    WHERE resolution IS NULL OR resolution = 'still_failing';

-- 2. The overdue-gap gauge, refreshed every few seconds, reads the
--    aggregates with an open gap only, not one row per aggregate ever seen.
CREATE INDEX inbox_aggregate_gap_since_idx ON inbox_aggregate (gap_since)
    WHERE gap_since IS NOT NULL;
