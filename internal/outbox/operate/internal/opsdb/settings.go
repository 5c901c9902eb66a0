package opsdb

// Written by hand beside the generated code: the session settings the
// retention cleanup sets before its queries, kept next to the queries they
// steer. plan_test.go (package operate) runs each query under EXPLAIN with
// them.

// CleanupInIndexOrder is set once for the connection the cleanup holds
// until its run ends. outbox_delivered_cleanup_idx and
// outbox_direct_log_sent_idx give each batch's order, so reading one and
// stopping at the batch size costs a batch, whatever the backlog. With
// statistics taken before the table grew, the planner may instead read
// every row past the cutoff and sort it, for every batch. Sorting is
// discouraged for the session; JIT is turned off with it, because the sort
// penalty lifts the plan's cost past the JIT threshold and each batch
// would be compiled first. The relay's claim sets the same for its
// transaction (outboxdb.ClaimInIndexOrder, which tells the planner's
// mistake in full).
const CleanupInIndexOrder = "SELECT set_config('enable_sort', 'off', false), set_config('jit', 'off', false)"
