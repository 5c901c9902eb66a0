-- +goose Up
-- A replay's run survives the process that runs it (O5). Until now a plan
-- was marked running in one transaction and done or failed at the end,
-- and nothing in between: a runner killed mid-run left it running for
-- good, and run and approve refused it from then on.
--
-- A running plan now belongs to one runner (run_owner, unique per run)
-- for as long as that runner renews its lease (run_lease_expires_at, on
-- the database's clock). A runner that stops cleanly marks the plan
-- interrupted; one that dies stops renewing, and its plan counts as
-- abandoned once the lease has passed. Either is taken over by the next
-- runner (a relay process looks for them, and `run` continues them), from
-- the first item not yet published: the items already record that.
ALTER TABLE outbox_replay_plan
    ADD COLUMN run_owner            text,
    ADD COLUMN run_lease_expires_at timestamptz,
    DROP CONSTRAINT outbox_replay_plan_status_check,
    ADD CONSTRAINT outbox_replay_plan_status_check
        CHECK (status IN ('planned', 'approved', 'running', 'interrupted', 'done', 'failed'));

-- A plan left running by a version without leases is either still being
-- run by a process of that version (during a rolling deploy) or stuck. It
-- gets a lease long enough for an old runner to finish the largest plan at
-- the default rate (10,000 events at 100 a second), after which it is
-- taken over like any abandoned plan.
UPDATE outbox_replay_plan
SET run_lease_expires_at = clock_timestamp() + interval '15 minutes'
WHERE status = 'running';

-- The runners' search for plans to take over reads only these rows.
CREATE INDEX outbox_replay_plan_unfinished_idx ON outbox_replay_plan (run_lease_expires_at)
    WHERE status IN ('running', 'interrupted');

-- The four-eyes rule counts what one admin planned or ran in a rolling
-- window without a second admin's approval.
CREATE INDEX outbox_replay_plan_created_by_idx ON outbox_replay_plan (created_by, created_at);
CREATE INDEX outbox_replay_plan_run_by_idx ON outbox_replay_plan (run_by, run_started_at);
