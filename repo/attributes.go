package repo

import (
	"database/sql/driver"
	"encoding/json"
	"fmt"
	"strings"

	"github.com/uptrace/bun/dialect"
	"github.com/uptrace/bun/dialect/pgdialect"
	"github.com/uptrace/bun/schema"

	"github.com/subscriberd/subscriberd/model"
)

// attributesColumn is subscribers.attributes as stored (docs/api-contract.md §19): the
// compact JSON of model.Attributes.JSON (jsonb on PostgreSQL, text on SQLite). "" (a row
// built without attributes) is stored as {}.
type attributesColumn string

// Value implements driver.Valuer.
func (a attributesColumn) Value() (driver.Value, error) {
	if a == "" {
		return "{}", nil
	}
	return string(a), nil
}

func attributesOf(a model.Attributes) attributesColumn { return attributesColumn(a.JSON()) }

// model reads the column back; "" (not read) gives nil.
func (a attributesColumn) model() model.Attributes {
	switch a {
	case "":
		return nil
	case "{}": // most subscribers: a list page decodes 25 rows, and a JSON decoder costs more
		return model.Attributes{}
	}
	attrs, err := model.DecodeAttributes([]byte(a))
	if err != nil {
		return nil // written by Attributes.JSON only
	}
	return attrs
}

// tagsColumn is subscribers.tags as stored: text[] COLLATE "C" on PostgreSQL, a JSON array
// of text on SQLite, sorted and without duplicates either way; nil is stored as the empty
// set. bun caches a type's appender for every dialect at once, so the column's form is chosen
// when a statement is written.
type tagsColumn []string

// AppendQuery implements schema.QueryAppender.
func (t tagsColumn) AppendQuery(gen schema.QueryGen, b []byte) ([]byte, error) {
	if gen.Dialect().Name() == dialect.PG {
		return append(b, "'"+strings.ReplaceAll(pgTextArray(t), "'", "''")+"'::text[]"...), nil
	}
	return gen.Dialect().AppendString(b, tagsJSON(t)), nil
}

// Scan implements sql.Scanner: a PostgreSQL array's text or a JSON array.
func (t *tagsColumn) Scan(src any) error {
	var b []byte
	switch v := src.(type) {
	case nil:
		*t = nil
		return nil
	case []byte:
		b = v
	case string:
		b = []byte(v)
	default:
		return fmt.Errorf("tags: unexpected %T", src)
	}
	if s := string(b); s == "{}" || s == "[]" { // most subscribers: no tags
		*t = tagsColumn{}
		return nil
	}
	if len(b) > 0 && b[0] == '[' {
		return json.Unmarshal(b, (*[]string)(t))
	}
	return pgdialect.Array((*[]string)(t)).Scan(b)
}

// tagsOf is the column of tags; nil is the empty set.
func tagsOf(tags []string) tagsColumn {
	if tags == nil {
		return tagsColumn{}
	}
	return tagsColumn(tags)
}

// model is the set read back: never nil.
func (t tagsColumn) model() []string {
	if t == nil {
		return []string{}
	}
	return []string(t)
}
