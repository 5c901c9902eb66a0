package outbox

import (
	"embed"
	"io/fs"
)

// MigrationLine names the outbox's migrations as a line of their own. A
// service applies it next to its own line and tracks it separately (with
// goose: the version table outbox_migrations), so the outbox's schema moves
// forward on its own numbering, whatever the service's files are called.
const MigrationLine = "outbox"

//go:embed migrations/*.sql
var migrationFiles embed.FS

// Migrations returns the outbox's goose SQL migrations, numbered from 1 in
// their own line. Apply them before starting a relay.Relay or calling Insert;
// sqlc reads the same files, so the queries and the schema cannot drift.
func Migrations() fs.FS {
	sub, err := fs.Sub(migrationFiles, "migrations")
	if err != nil {
		panic(err) // the directory is embedded at build time
	}
	return sub
}
