package notify

import (
	"context"
	"errors"
	"testing"

	"github.com/google/uuid"
	"github.com/jackc/pgx/v5/pgconn"
	"github.com/stretchr/testify/require"

	"github.com/outboxref/orders/db/schema"
	"github.com/outboxref/orders/internal/notify/notifydb"
	"github.com/outboxref/orders/internal/pgtest"
)

// TestLedgerMessageIDFollowsItsKey: one email, one Message-ID. The ledger
// keeps no unique index on message_id; the primary key makes it unique
// because the database refuses any Message-ID other than the one derived
// from the row's operation key, as MessageID derives it from the event.
func TestLedgerMessageIDFollowsItsKey(t *testing.T) {
	t.Parallel()
	db := pgtest.New(t, schema.Notifier()...)
	ctx := context.Background()
	insert := func(key, messageID string) error {
		_, err := db.Pool.Exec(ctx, `INSERT INTO email_send (operation_key, event_id, message_id, order_id, event_type,
				recipient, subject, body) VALUES ($1, $2, $3, $4, 'order.placed', 'a@example.com', 's', 'b')`,
			key, uuid.New(), messageID, uuid.New())
		return err
	}

	id := uuid.New()
	require.Equal(t, "<"+OperationKey(id)+">", MessageID(id))
	_, err := notifydb.New(db.Pool).EmailSendInsert(ctx, notifydb.EmailSendInsertParams{
		OperationKey: OperationKey(id), EventID: id, MessageID: MessageID(id), OrderID: uuid.New(),
		EventType: "order.placed", Recipient: "a@example.com", Subject: "s", Body: "b"})
	require.NoError(t, err, "the Message-ID the notifier derives is accepted")

	// Another row may not reuse an existing Message-ID, nor carry one that
	// does not follow from its own key.
	for _, messageID := range []string{MessageID(id), "<other@test>", "", MessageID(uuid.New())} {
		var pgErr *pgconn.PgError
		err := insert("other@test-"+uuid.NewString(), messageID)
		require.True(t, errors.As(err, &pgErr), "message_id %q: %v", messageID, err)
		require.Equal(t, "email_send_message_id_derived", pgErr.ConstraintName, "message_id %q", messageID)
	}
	require.NoError(t, insert("k1", "<k1>"))
}
