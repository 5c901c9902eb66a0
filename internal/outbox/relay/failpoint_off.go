//go:build !failpoints

package relay

// failpoint does nothing: the relay's crash points are armed only in builds
// with the "failpoints" tag (failpoint_on.go), which the end-to-end tests
// use to kill a real relay process inside each crash window.
func failpoint(string) {}
