package ordersapi

import (
	"net/http"

	"github.com/outboxref/orders/internal/auth"
	"github.com/outboxref/orders/internal/orders"
	"github.com/outboxref/orders/internal/outbox/problem"
)

// Errors are RFC 9457 problems written by outbox/problem, the module's one
// problem writer. What is the orders API's own stays here: its problem
// types, and the extension member "current_version", the order's version
// on a 412, so the client can re-read and decide.

// Problem types, one per distinct failure a client may handle.
const (
	typeMalformed        = "urn:outboxref:problem:malformed-request"
	typeValidation       = "urn:outboxref:problem:validation"
	typeTooLarge         = "urn:outboxref:problem:body-too-large"
	typeStaleVersion     = "urn:outboxref:problem:stale-version"
	typeIfMatchRequired  = "urn:outboxref:problem:if-match-required"
	typeIllegalState     = "urn:outboxref:problem:illegal-transition"
	typeIdempotencyReuse = "urn:outboxref:problem:idempotency-key-reused"
	typeCommitUnknown    = "urn:outboxref:problem:commit-unknown"
	typeUnavailable      = "urn:outboxref:problem:unavailable"
)

// fieldErrors lists the domain's invalid fields as a problem lists them.
func fieldErrors(fe []orders.FieldError) []problem.FieldError {
	out := make([]problem.FieldError, len(fe))
	for i, f := range fe {
		out[i] = problem.FieldError{Field: f.Field, Message: f.Message}
	}
	return out
}

// requireAdmin answers 403 to any caller without the admin role, except a
// viewer's read (GET): a viewer sees the operations' reports and changes
// nothing.
func requireAdmin(next http.Handler) http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		p, ok := auth.FromContext(r.Context())
		read := r.Method == http.MethodGet || r.Method == http.MethodHead
		if !ok || !(p.Role.CanWrite() || (p.Role == auth.RoleViewer && read)) {
			problem.Write(w, problem.Problem{Status: http.StatusForbidden, Detail: "the admin API needs the admin role (the viewer role reads only)"})
			return
		}
		next.ServeHTTP(w, r)
	})
}

// refuseViewer answers 403 to a viewer: the order API is for customers,
// admins and the notifier, and a viewer's subject must never read as a
// customer's.
func refuseViewer(next http.Handler) http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if p, _ := auth.FromContext(r.Context()); p.Role == auth.RoleViewer {
			problem.Write(w, problem.Problem{Status: http.StatusForbidden, Detail: "the viewer role reads the operations only"})
			return
		}
		next.ServeHTTP(w, r)
	})
}
