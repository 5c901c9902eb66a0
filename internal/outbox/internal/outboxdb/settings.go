package outboxdb

// Written by hand beside the generated code: the session settings the
// relay's claim and the retention cleanup set before their queries, kept
// next to the queries they steer. plan_test.go (package outbox) runs each
// query under EXPLAIN with them.

// ClaimInIndexOrder is set in the claim's transaction, before the claim.
// outbox_pending_due_idx gives the claim's order, so reading it and
// stopping at the batch size costs a batch, whatever the backlog. But with
// statistics taken before a burst (on an empty table, as after an outage),
// the planner expects a row or two to be due and prices "fetch every due
// row and sort it" the same as the index walk: it then sorts the whole
// backlog for every batch, and draining a backlog of N events takes time
// in N². Sorting is discouraged for this one transaction; JIT is turned
// off with it, because the sort penalty lifts the plan's cost past the JIT
// threshold and each claim would be compiled first.
const ClaimInIndexOrder = "SELECT set_config('enable_sort', 'off', true), set_config('jit', 'off', true)"

// CleanupInIndexOrder is ClaimInIndexOrder for the cleanup's session: set
// once for the connection the cleanup holds until its run ends.
const CleanupInIndexOrder = "SELECT set_config('enable_sort', 'off', false), set_config('jit', 'off', false)"
