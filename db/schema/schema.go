// Package schema lists each service's migration lines: the lines of the
// reusable packages it uses (the outbox, the inbox), which ship in those
// packages, followed by the service's own line, embedded here: the tables
// of the orders service (orders/) and of the notifier (notifier/).
//
// The same files are sqlc's schema input (see sqlc.yaml; the queries live
// next door in db/queries), so the generated queries and the database the
// binaries create can never drift apart.
package schema

import (
	"embed"
	"io/fs"

	"github.com/outboxref/orders/internal/inbox"
	"github.com/outboxref/orders/internal/migrate"
	"github.com/outboxref/orders/internal/outbox"
)

//go:embed orders/*.sql notifier/*.sql
var files embed.FS

// Orders returns the orders service's lines, in the order they are applied:
// the outbox, then orders, order lines and idempotency keys.
func Orders() []migrate.Line {
	return []migrate.Line{
		{Name: outbox.MigrationLine, FS: outbox.Migrations()},
		{Name: "orders", FS: sub("orders")},
	}
}

// Notifier returns the notifier's lines, in the order they are applied: the
// inbox, then the order projection and the email send ledger.
func Notifier() []migrate.Line {
	return []migrate.Line{
		{Name: inbox.MigrationLine, FS: inbox.Migrations()},
		{Name: "notifier", FS: sub("notifier")},
	}
}

func sub(dir string) fs.FS {
	s, err := fs.Sub(files, dir)
	if err != nil {
		panic(err) // embedded at build time
	}
	return s
}
