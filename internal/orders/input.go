package orders

import (
	"crypto/sha256"
	"encoding/json"
	"fmt"
	"net/mail"
	"regexp"
	"strings"
	"unicode"
)

// CreateInput is the body of POST /orders. Numeric fields are pointers so
// that a missing field is told apart from a zero.
type CreateInput struct {
	Email    string      `json:"email"`
	Currency string      `json:"currency"`
	Items    []LineInput `json:"items"`
}

// LineInput is one requested order line.
type LineInput struct {
	SKU            string `json:"sku"`
	Quantity       *int64 `json:"quantity"`
	UnitPriceCents *int64 `json:"unit_price_cents"`
}

var currencyRE = regexp.MustCompile(`^[A-Z]{3}$`)

// plainAddress reports whether s is one bare email address, such as
// alice@example.com: net/mail parses it as exactly one address whose
// address part is all of s (so no display name, comment or angle
// brackets), and it holds no line break. The notifier puts
// it in a To header as it is, so anything else (a name, a list, a CR or
// LF) could add recipients or headers to the email.
func plainAddress(s string) bool {
	// net/mail refuses line breaks in an address today; the explicit test
	// keeps the promise whatever a later parser accepts.
	if len(s) > MaxEmailLength || strings.ContainsAny(s, "\r\n") {
		return false
	}
	addr, err := mail.ParseAddress(s)
	return err == nil && addr.Address == s
}

// Validate checks every field and returns a *ValidationError naming each
// invalid one, or nil.
func (in CreateInput) Validate() error {
	var fe []FieldError
	add := func(field, format string, args ...any) {
		fe = append(fe, FieldError{Field: field, Message: fmt.Sprintf(format, args...)})
	}
	switch {
	case in.Email == "":
		add("email", "is required")
	case len(in.Email) > MaxEmailLength:
		add("email", "must be at most %d characters", MaxEmailLength)
	case !plainAddress(in.Email):
		add("email", "must be a plain address such as alice@example.com")
	}
	if !currencyRE.MatchString(in.Currency) {
		add("currency", "must be a three-letter upper-case ISO 4217 code such as EUR")
	}
	switch {
	case len(in.Items) == 0:
		add("items", "must contain at least one line")
	case len(in.Items) > MaxLines:
		add("items", "must contain at most %d lines, got %d", MaxLines, len(in.Items))
	default:
		for i, l := range in.Items {
			p := fmt.Sprintf("items[%d].", i)
			switch {
			case l.SKU == "":
				add(p+"sku", "is required")
			case len(l.SKU) > MaxSKULength:
				add(p+"sku", "must be at most %d characters", MaxSKULength)
			case strings.IndexFunc(l.SKU, func(r rune) bool { return !unicode.IsPrint(r) || unicode.IsSpace(r) }) >= 0:
				add(p+"sku", "must not contain spaces or control characters")
			}
			switch {
			case l.Quantity == nil:
				add(p+"quantity", "is required")
			case *l.Quantity < 1 || *l.Quantity > MaxQuantity:
				add(p+"quantity", "must be from 1 to %d", MaxQuantity)
			}
			switch {
			case l.UnitPriceCents == nil:
				add(p+"unit_price_cents", "is required")
			case *l.UnitPriceCents < 0 || *l.UnitPriceCents > MaxUnitPrice:
				add(p+"unit_price_cents", "must be from 0 to %d", MaxUnitPrice)
			}
		}
	}
	if len(fe) > 0 {
		return &ValidationError{Fields: fe}
	}
	return nil
}

// fingerprint identifies the request for Idempotency-Key checks. It hashes
// the decoded input re-encoded, so whitespace and key order do not matter.
func (in CreateInput) fingerprint() []byte {
	b, _ := json.Marshal(in) // plain struct of strings and ints: cannot fail
	sum := sha256.Sum256(b)
	return sum[:]
}

// ValidateIdempotencyKey checks the Idempotency-Key header value.
func ValidateIdempotencyKey(key string) error {
	if len(key) > maxIdempotencyKey || strings.IndexFunc(key, func(r rune) bool { return r < 0x21 || r > 0x7e }) >= 0 {
		return &ValidationError{Fields: []FieldError{{
			Field:   "Idempotency-Key",
			Message: fmt.Sprintf("must be 1 to %d visible ASCII characters", maxIdempotencyKey),
		}}}
	}
	return nil
}
