// Package migrations embeds the SQL migrations of subscriberd: the only source of its schema.
package migrations

import (
	"embed"
	"io/fs"

	"github.com/uptrace/bun/migrate"
)

//go:embed postgres/*.sql
var files embed.FS

// Postgres returns the migrations for PostgreSQL.
func Postgres() (*migrate.Migrations, error) {
	sub, err := fs.Sub(files, "postgres")
	if err != nil {
		return nil, err
	}
	m := migrate.NewMigrations()
	if err := m.Discover(sub); err != nil {
		return nil, err
	}
	return m, nil
}
