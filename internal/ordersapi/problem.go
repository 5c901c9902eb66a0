package ordersapi

import (
	"encoding/json"
	"net/http"

	"github.com/outboxref/orders/internal/auth"
)

// problem is an RFC 9457 problem details body. Extension members (such as
// current_version or errors) are flattened into the object.
type problem struct {
	Type   string `json:"type"`
	Title  string `json:"title"`
	Status int    `json:"status"`
	Detail string `json:"detail,omitempty"`
	// Errors names each invalid field of a validation failure.
	Errors any `json:"errors,omitempty"`
	// CurrentVersion is the order's version on a 412, so the client can
	// re-read and decide.
	CurrentVersion *int64 `json:"current_version,omitempty"`
}

// Problem types, one per distinct failure a client may handle.
const (
	typeBlank            = "about:blank"
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

func writeProblem(w http.ResponseWriter, p problem) {
	if p.Type == "" {
		p.Type = typeBlank
	}
	if p.Title == "" {
		p.Title = http.StatusText(p.Status)
	}
	w.Header().Set("Content-Type", "application/problem+json")
	w.Header().Set("Cache-Control", "no-store")
	w.WriteHeader(p.Status)
	_ = json.NewEncoder(w).Encode(p)
}

// requireAdmin answers 403 to any caller without the admin role.
func requireAdmin(next http.Handler) http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if p, ok := auth.FromContext(r.Context()); !ok || p.Role != auth.RoleAdmin {
			writeProblem(w, problem{Status: http.StatusForbidden, Detail: "the admin API needs the admin role"})
			return
		}
		next.ServeHTTP(w, r)
	})
}
