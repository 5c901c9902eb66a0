// Package failpoint kills the process at named points, for the tests that
// prove the crash windows with real processes (V2).
//
// A failpoint is a call to Inject at a point where a process can die with
// distinct consequences: before a local transaction commits, after it
// committed and before the broker heard of it, and so on. In a normal build
// Inject is an empty function that the compiler removes: no failpoint code
// and no environment lookup exist in the binaries (a test checks the
// symbols). Built with the tag "failpoints", as the e2e harness builds the
// binaries, the points named in the FAILPOINTS environment variable are
// armed:
//
//	FAILPOINTS=notifier/after-local-commit=kill,relay/after-claim=kill@3
//
// "kill" sends SIGKILL to the process itself the first time the point is
// reached, "kill@N" the N-th time: no deferred code runs, no connection is
// closed politely, exactly as when the machine dies. "stop" sends SIGSTOP
// instead: the process freezes there until the test sends SIGCONT.
package failpoint

// The failpoints of the notifier (the relay's are in the outbox package,
// which carries its own copy of this mechanism so that it stays
// self-contained).
const (
	// NotifierBeforeLocalCommit is reached with a batch's records applied
	// in the local transaction, before its COMMIT.
	NotifierBeforeLocalCommit = "notifier/before-local-commit"
	// NotifierAfterLocalCommit is reached after a batch's local
	// transaction committed, before its offsets are marked for commit.
	NotifierAfterLocalCommit = "notifier/after-local-commit"
)
