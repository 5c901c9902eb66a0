package inbox

import (
	"context"
	"errors"
	"net"

	"github.com/jackc/pgx/v5/pgconn"
)

// IsTransient reports whether err comes from the infrastructure (the
// database unreachable or restarting, a deadlock, a timeout) rather than
// from the event. Such a failure says nothing about the event: the work is
// retried as it is, for as long as it takes, and never parked. Anything
// else fails the same way on every attempt and, after a few, is parked.
func IsTransient(err error) bool {
	if err == nil {
		return false
	}
	// Refused or failed connection attempts, whatever the server said
	// (too many clients, the database not accepting connections).
	var connectErr *pgconn.ConnectError
	if errors.As(err, &connectErr) {
		return true
	}
	var pgErr *pgconn.PgError
	if errors.As(err, &pgErr) {
		switch pgErr.Code[:2] {
		case "08", // connection exception
			"40", // transaction rollback: deadlock, serialization failure
			"53", // insufficient resources
			"57", // operator intervention: shutdown, terminated connection, cancel
			"58": // system error
			return true
		}
		return pgErr.Code == "55P03" // lock_not_available
	}
	// A cancelled context is the consumer stopping (a shutdown, a revoked
	// partition), never the event's fault: parking on it would park good
	// records on every restart.
	var netErr net.Error
	return errors.As(err, &netErr) || errors.Is(err, context.Canceled) ||
		errors.Is(err, context.DeadlineExceeded) || pgconn.Timeout(err) || pgconn.SafeToRetry(err)
}
