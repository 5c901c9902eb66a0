//go:build !failpoints

package failpoint

// Inject does nothing: failpoints exist only in builds with the
// "failpoints" tag.
func Inject(string) {}
