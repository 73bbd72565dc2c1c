// Package migrations embeds the SQL migrations of subscriberd, one set per database engine:
// the only source of its schema.
package migrations

import (
	"embed"
	"io/fs"

	"github.com/uptrace/bun/migrate"
)

//go:embed postgres/*.sql sqlite/*.sql
var files embed.FS

// Postgres returns the migrations for PostgreSQL.
func Postgres() (*migrate.Migrations, error) { return discover("postgres") }

// SQLite returns the migrations for the embedded SQLite store: the same schema semantics as
// Postgres, in SQLite's dialect.
func SQLite() (*migrate.Migrations, error) { return discover("sqlite") }

func discover(dir string) (*migrate.Migrations, error) {
	sub, err := fs.Sub(files, dir)
	if err != nil {
		return nil, err
	}
	m := migrate.NewMigrations()
	if err := m.Discover(sub); err != nil {
		return nil, err
	}
	return m, nil
}
