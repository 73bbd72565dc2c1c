package repo

import (
	"net/url"
	"path/filepath"
	"strings"

	"github.com/uptrace/bun"
	"github.com/uptrace/bun/extra/bunotel"
	"go.opentelemetry.io/otel/attribute"
)

// queryHook makes one OpenTelemetry CLIENT span per query (through the global tracer
// provider), named "{operation} {table}" as the database semantic conventions ask
// ("INSERT subscribers", "SELECT api_keys").
//
// The statement is bun's query template with "?" for every argument: bunotel's formatted
// queries stay off, because bun inlines arguments, so formatted text would put emails into
// traces. bunotel emits the older attribute names (db.system, db.statement, db.name); the
// stable db.system.name and db.namespace are added so both generations of backends match.
//
// On SQLite the system is "sqlite" and the namespace the file's name.
func queryHook(dsn string) bun.QueryHook {
	var dbName string
	system := "postgresql"
	if IsSQLite(dsn) {
		system = "sqlite"
		if p, err := SQLitePath(dsn); err == nil {
			dbName = filepath.Base(p)
		}
	} else if u, err := url.Parse(dsn); err == nil {
		dbName = strings.TrimPrefix(u.Path, "/")
	}
	return bunotel.NewQueryHook(
		bunotel.WithDBName(dbName),
		bunotel.WithAttributes(
			attribute.String("db.system.name", system),
			attribute.String("db.namespace", dbName),
		),
		bunotel.WithFormattedQueries(false),
		bunotel.WithSpanNameQueryGen(spanName),
	)
}

func spanName(e *bun.QueryEvent) string {
	op := e.Operation()
	if e.IQuery != nil {
		if t := strings.Trim(e.IQuery.GetTableName(), `"`); t != "" {
			return op + " " + t
		}
	}
	return op
}
