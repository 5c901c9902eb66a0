package outboxdb

// Written by hand beside the generated code: the session settings the
// relay's claim sets before its query, kept next to the query it steers.
// plan_test.go (package outbox) runs the query under EXPLAIN with them;
// the retention cleanup's counterpart is opsdb.CleanupInIndexOrder.

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
