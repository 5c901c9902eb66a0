package notify

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"mime"
	"mime/quotedprintable"
	"strings"
	"time"

	"github.com/google/uuid"
	"github.com/jackc/pgx/v5"

	"github.com/outboxref/orders/internal/notify/notifydb"
)

// messageIDDomain is the right-hand side of every Message-ID the notifier
// generates. Together with the event id it makes the Message-ID globally
// unique and stable across resends.
const messageIDDomain = "notifier.outboxref"

// OperationKey is the send ledger's key for the email caused by an event:
// derived from the event id, so a redelivered event maps to the same row.
func OperationKey(eventID uuid.UUID) string { return eventID.String() + "@" + messageIDDomain }

// MessageID is the Message-ID header of the email caused by an event. A
// resend carries the same one, so receivers that deduplicate on it show
// the email once.
func MessageID(eventID uuid.UUID) string { return "<" + OperationKey(eventID) + ">" }

// Ledger states (C4).
const (
	StatePending = "pending"
	StateSending = "sending"
	StateSent    = "sent"
	StateUnknown = "unknown"
	StateFailed  = "failed"
	StateSkipped = "skipped"
)

// emailIntent is an email the notifier owes for one event.
type emailIntent struct {
	EventID          uuid.UUID
	OrderID          uuid.UUID
	EventType        string
	AggregateVersion int64
	EventTime        time.Time
	Recipient        string
	Subject          string
	Body             string
	// SkipReason, when set, records the email as skipped instead of
	// pending: the event is accounted for, and nothing will be sent.
	SkipReason string
	// Traceparent and Tracestate are the trace context of the record that
	// asked for the email, kept with the row so the send continues the
	// event's trace (L4); empty when it carried none.
	Traceparent, Tracestate string
}

// Skip reasons of the send ledger (skip_reason).
const (
	SkipStale    = "stale"     // older than EMAIL_MAX_AGE when it could first be sent
	SkipConflict = "conflict"  // another event owns the order version
	SkipNotFound = "not_found" // the orders service does not know the order
	SkipImpostor = "impostor"  // the orders service did not write this event at its version (C7)
	SkipDropped  = "dropped"   // an operator dropped the held event
)

// enqueueEmail writes the intent as one ledger row in the caller's
// transaction. If the row exists (the event came back), the existing row
// and its state are returned unchanged: redelivery returns the original
// result rather than a second email. An email written after one for a
// later version of the same order (the event arrived late, after a resync)
// says so in its subject and first lines, with the event's time.
func enqueueEmail(ctx context.Context, q *notifydb.Queries, m emailIntent) (notifydb.EmailSend, error) {
	if m.SkipReason == "" {
		later, err := q.EmailSendLaterExists(ctx, notifydb.EmailSendLaterExistsParams{OrderID: m.OrderID, AggregateVersion: &m.AggregateVersion})
		if err != nil {
			return notifydb.EmailSend{}, fmt.Errorf("look for a later email: %w", err)
		}
		if later {
			markLate(&m)
		}
	}
	var skip *string
	if m.SkipReason != "" {
		skip = &m.SkipReason
	}
	row, err := q.EmailSendInsert(ctx, notifydb.EmailSendInsertParams{
		OperationKey: OperationKey(m.EventID), EventID: m.EventID, MessageID: MessageID(m.EventID),
		OrderID: m.OrderID, EventType: m.EventType, AggregateVersion: &m.AggregateVersion, EventTime: &m.EventTime,
		Recipient: m.Recipient, Subject: m.Subject, Body: m.Body, SkipReason: skip,
		Traceparent: nonEmpty(m.Traceparent), Tracestate: nonEmpty(m.Tracestate),
	})
	if errors.Is(err, pgx.ErrNoRows) {
		row, err = q.EmailSendGet(ctx, OperationKey(m.EventID))
	}
	if err != nil {
		return notifydb.EmailSend{}, fmt.Errorf("write email intent: %w", err)
	}
	return row, nil
}

// markLate says in the email's subject and first lines that it arrives
// after an email about a later version of the order.
func markLate(m *emailIntent) {
	m.Subject = "Update: " + m.Subject
	m.Body = fmt.Sprintf("This update arrives late: it happened on %s, before an update about this order that you may already have received.\n\n",
		m.EventTime.UTC().Format("2 January 2006 at 15:04 UTC")) + m.Body
}

func shortID(id uuid.UUID) string { return id.String()[:8] }

func money(cents int64, currency string) string {
	sign := ""
	if cents < 0 {
		sign, cents = "-", -cents
	}
	return fmt.Sprintf("%s%d.%02d %s", sign, cents/100, cents%100, currency)
}

func placedEmail(id uuid.UUID, p *placedPayload) (subject, body string) {
	var b strings.Builder
	fmt.Fprintf(&b, "Hello,\n\nthank you for your order %s. We have received it.\n\n", id)
	for _, it := range p.Items {
		fmt.Fprintf(&b, "  %d x %s at %s\n", it.Quantity, it.SKU, money(it.UnitPriceCents, p.Currency))
	}
	fmt.Fprintf(&b, "\nTotal: %s\n", money(*p.TotalCents, p.Currency))
	return fmt.Sprintf("Order %s received", shortID(id)), b.String()
}

func paidEmail(id uuid.UUID, p *paidPayload) (subject, body string) {
	amount := ""
	if p.TotalCents != nil && p.Currency != "" {
		amount = " of " + money(*p.TotalCents, p.Currency)
	}
	return fmt.Sprintf("Payment received for order %s", shortID(id)),
		fmt.Sprintf("Hello,\n\nwe received your payment%s for order %s.\n", amount, id)
}

func cancelledEmail(id uuid.UUID, p *cancelledPayload) (subject, body string) {
	body = fmt.Sprintf("Hello,\n\nyour order %s has been cancelled.\n", id)
	if p.PreviousStatus == "paid" {
		body += "Your payment will be refunded.\n"
	}
	return fmt.Sprintf("Order %s cancelled", shortID(id)), body
}

func shippedEmail(id uuid.UUID) (subject, body string) {
	return fmt.Sprintf("Order %s shipped", shortID(id)),
		fmt.Sprintf("Hello,\n\nyour order %s is on its way.\n", id)
}

// buildMessage renders a ledger row as an RFC 5322 message. Every header
// comes from the row, so a resend is byte for byte the same email. That
// includes X-Trace-Id, the trace id of the event that asked for the email
// (L4), which leads from a message in a mailbox to its whole trace.
func buildMessage(from string, row notifydb.EmailSend) []byte {
	var b bytes.Buffer
	h := func(k, v string) { fmt.Fprintf(&b, "%s: %s\r\n", k, v) }
	h("From", from)
	h("To", row.Recipient)
	h("Subject", mime.QEncoding.Encode("utf-8", row.Subject))
	h("Date", row.CreatedAt.UTC().Format(time.RFC1123Z))
	h("Message-ID", row.MessageID)
	h("X-Event-ID", row.EventID.String())
	if id := traceID(row.Traceparent); id != "" {
		h("X-Trace-Id", id)
	}
	h("MIME-Version", "1.0")
	h("Content-Type", "text/plain; charset=utf-8")
	h("Content-Transfer-Encoding", "quoted-printable")
	b.WriteString("\r\n")
	qp := quotedprintable.NewWriter(&b)
	_, _ = qp.Write([]byte(strings.ReplaceAll(row.Body, "\n", "\r\n")))
	_ = qp.Close()
	return b.Bytes()
}
