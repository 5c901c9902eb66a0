// Package problem writes and reads RFC 9457 problem details
// (application/problem+json), the error body of the module's HTTP APIs: a
// type URI a client can branch on, the HTTP status, a title, a detail for
// the human reading it, and, for validation failures, the fields at fault.
//
// A Problem is also an error, so a client (an admin CLI) can return the
// server's answer as it is and a caller can test it with errors.As.
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
