// Package schema embeds the numbered SQL migrations of each service.
//
// The same files are sqlc's schema input (see sqlc.yaml), so the generated
// queries and the database the binaries create can never drift apart.
package schema

import "embed"

// Orders holds the orders service's migrations: orders, order lines,
// idempotency keys and the outbox.
//
//go:embed orders/*.sql
var Orders embed.FS

// Notifier holds the notifier service's migrations: the inbox (processed
// events, per-aggregate versions, held events, conflicts, parked records),
// the order projection and the email send ledger.
//
//go:embed notifier/*.sql
var Notifier embed.FS
