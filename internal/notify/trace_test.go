package notify

import (
	"bytes"
	"net/mail"
	"testing"
	"time"

	"github.com/google/uuid"
	"github.com/stretchr/testify/require"

	"github.com/outboxref/orders/internal/notify/notifydb"
)

// TestEmailCarriesTraceID (L4): the email names the trace of the event that
// asked for it in X-Trace-Id, taken from the ledger row, so that rendering
// the row again (a resend) gives the same bytes. A row without a trace
// context, or with one that is not a W3C traceparent, gets no header.
func TestEmailCarriesTraceID(t *testing.T) {
	t.Parallel()
	tp := "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01"
	bad := "not-a-traceparent"
	row := func(traceparent *string) notifydb.EmailSend {
		return notifydb.EmailSend{
			OperationKey: "k", EventID: uuid.New(), MessageID: "<m@test>", Recipient: "alice@example.com",
			Subject: "Order received", Body: "Hello\n", CreatedAt: time.Date(2026, 5, 1, 12, 0, 0, 0, time.UTC),
			Traceparent: traceparent,
		}
	}
	for name, tc := range map[string]struct {
		traceparent *string
		want        string
	}{
		"Traced":    {&tp, "4bf92f3577b34da6a3ce929d0e0e4736"},
		"Untraced":  {nil, ""},
		"Malformed": {&bad, ""},
	} {
		t.Run(name, func(t *testing.T) {
			t.Parallel()
			r := row(tc.traceparent)
			first := buildMessage("orders@shop.test", r)
			require.Equal(t, first, buildMessage("orders@shop.test", r), "a resend is the same email, byte for byte")
			m, err := mail.ReadMessage(bytes.NewReader(first))
			require.NoError(t, err)
			require.Equal(t, tc.want, m.Header.Get("X-Trace-Id"))
		})
	}
}
