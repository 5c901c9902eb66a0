// Package problem writes and reads RFC 9457 problem details
// (application/problem+json), the error body of every HTTP API of the
// module: a type URI a client can branch on, the HTTP status, a title, a
// detail for the human reading it, for validation failures the fields at
// fault, and any extension member an API adds (a stale version's current
// version, say).
//
// It is the module's one problem type and one writer. The orders API, the
// notifier's admin API, the outbox's operations API and the input guard in
// front of both admin APIs (adminguard) all write through Write, and the
// admin clients read answers back with Read, so a document has one shape
// whichever service sent it.
//
// It lives under internal/outbox, not beside the services, because the
// outbox must stay self-contained: a service copies the directory with
// `cp -r` and gets its operations API, that API's client and the problem
// documents both speak (L1, checked by the outbox's TestSelfContained).
// The services import it from here, as they import outbox/adminguard and
// outbox/cloudevents. It imports only the standard library and knows
// nothing of orders or email: a service's own problem types (its URIs, its
// extension members) stay in the service.
//
// A Problem is also an error, so a client returns the server's answer as
// it is and a caller tests it with errors.As.
package problem

import (
	"encoding/json"
	"fmt"
	"io"
	"mime"
	"net/http"
)

// MediaType is the content type of a problem body.
const MediaType = "application/problem+json"

// TypeBlank is the type of a problem that says nothing beyond its status.
const TypeBlank = "about:blank"

// Problem is an RFC 9457 problem details body.
type Problem struct {
	Type   string `json:"type"`
	Title  string `json:"title"`
	Status int    `json:"status"`
	Detail string `json:"detail,omitempty"`
	// Errors names each invalid field of a validation failure.
	Errors []FieldError `json:"errors,omitempty"`
	// Extensions are further members of the object (RFC 9457 section
	// 3.2), written beside the standard ones: {"current_version": 3}. A
	// key that names a standard member is ignored, so an extension cannot
	// change what the type or the status say. Read fills it with every
	// member it does not know, decoded as encoding/json decodes into any.
	Extensions map[string]any `json:"-"`
}

// FieldError is one invalid field of a request.
type FieldError struct {
	Field   string `json:"field"`
	Message string `json:"message"`
}

// Error reads like the first line a person needs: "403 Forbidden: the
// admin role is required".
func (p *Problem) Error() string {
	s := fmt.Sprintf("%d %s", p.Status, p.Title)
	if p.Detail != "" {
		s += ": " + p.Detail
	}
	for _, f := range p.Errors {
		s += fmt.Sprintf("; %s %s", f.Field, f.Message)
	}
	return s
}

// standard is Problem without its methods, so that MarshalJSON and
// UnmarshalJSON can use the default encoding of the standard members.
type standard Problem

// MarshalJSON writes the standard members, then the extensions.
func (p Problem) MarshalJSON() ([]byte, error) {
	b, err := json.Marshal(standard(p))
	if err != nil || len(p.Extensions) == 0 {
		return b, err
	}
	members := map[string]json.RawMessage{}
	if err := json.Unmarshal(b, &members); err != nil {
		return nil, err
	}
	for k, v := range p.Extensions {
		if _, taken := members[k]; taken || isStandard(k) {
			continue
		}
		raw, err := json.Marshal(v)
		if err != nil {
			return nil, fmt.Errorf("problem extension %q: %w", k, err)
		}
		members[k] = raw
	}
	return json.Marshal(members)
}

// UnmarshalJSON reads the standard members, and every other one into
// Extensions.
func (p *Problem) UnmarshalJSON(b []byte) error {
	var s standard
	if err := json.Unmarshal(b, &s); err != nil {
		return err
	}
	var members map[string]any
	if err := json.Unmarshal(b, &members); err != nil {
		return err
	}
	for k := range members {
		if isStandard(k) {
			delete(members, k)
		}
	}
	if len(members) > 0 {
		s.Extensions = members
	}
	*p = Problem(s)
	return nil
}

func isStandard(member string) bool {
	switch member {
	case "type", "title", "status", "detail", "instance", "errors":
		return true
	}
	return false
}

// Write sends p with its status; an empty type or title is filled in from
// the status. Problems are never cached.
func Write(w http.ResponseWriter, p Problem) {
	if p.Type == "" {
		p.Type = TypeBlank
	}
	if p.Title == "" {
		p.Title = http.StatusText(p.Status)
	}
	w.Header().Set("Content-Type", MediaType)
	w.Header().Set("Cache-Control", "no-store")
	w.WriteHeader(p.Status)
	_ = json.NewEncoder(w).Encode(p)
}

// Read returns the problem in an error response: its body when it is a
// problem document, otherwise one built from the status and the start of
// the body (a proxy's error page, say), so a client always has one.
func Read(res *http.Response) *Problem {
	body, _ := io.ReadAll(io.LimitReader(res.Body, 64<<10))
	if mt, _, _ := mime.ParseMediaType(res.Header.Get("Content-Type")); mt == MediaType {
		var p Problem
		if err := json.Unmarshal(body, &p); err == nil && p.Status != 0 {
			return &p
		}
	}
	p := &Problem{Type: TypeBlank, Title: http.StatusText(res.StatusCode), Status: res.StatusCode}
	if len(body) > 0 {
		p.Detail = fmt.Sprintf("not a problem document (%s): %.200q", res.Header.Get("Content-Type"), body)
	}
	return p
}
