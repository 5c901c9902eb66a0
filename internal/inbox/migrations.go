package inbox

import (
	"embed"
	"io/fs"
)

// MigrationLine names the inbox's migrations as a line of their own. A
// service applies it next to its own line and tracks it separately (with
// goose: the version table inbox_migrations), so the inbox's schema moves
// forward on its own numbering, whatever the service's files are called.
const MigrationLine = "inbox"

//go:embed migrations/*.sql
var migrationFiles embed.FS

// Migrations returns the inbox's goose SQL migrations, numbered from 1 in
// their own line. Apply them before the first event is processed; sqlc
// reads the same files, so the queries and the schema cannot drift.
func Migrations() fs.FS {
	sub, err := fs.Sub(migrationFiles, "migrations")
	if err != nil {
		panic(err) // the directory is embedded at build time
	}
	return sub
}
