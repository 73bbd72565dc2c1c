package baseline

import (
	"context"
	"database/sql"
)

// Statement is a baseline that sends one given statement (bun's ? placeholders, args bound by
// bun as the service binds them) and reads its rows: the service's own SQL run bare, without
// the service. Each request counts as one row, like the service's list scenarios.
func (r *Runner) Statement(name, desc, query string, args ...any) Scenario {
	return Scenario{Name: name, Desc: desc, Op: r.wrap(func(ctx context.Context) (int, error) {
		rows, err := r.DB.QueryContext(ctx, r.DB.NewRaw(query, args...).String())
		if err != nil {
			return 0, err
		}
		return 1, drain(rows)
	})}
}

// drain reads every row of rows, as a client that uses them would, and closes it.
func drain(rows *sql.Rows) error {
	defer rows.Close()
	cols, err := rows.Columns()
	if err != nil {
		return err
	}
	vals := make([]any, len(cols))
	for i := range vals {
		vals[i] = new(sql.RawBytes)
	}
	for rows.Next() {
		if err := rows.Scan(vals...); err != nil {
			return err
		}
	}
	return rows.Err()
}
