package repo

import "testing"

// TestWithoutRowLocks: SQLite runs the stores' statements without PostgreSQL's row-lock
// clauses, wherever they stand, and changes nothing else.
func TestWithoutRowLocks(t *testing.T) {
	for _, c := range []struct{ in, want string }{
		{"SELECT 1 FROM subscribers WHERE id = ? FOR UPDATE", "SELECT 1 FROM subscribers WHERE id = ?"},
		{"SELECT * FROM imports WHERE id = ? FOR NO KEY UPDATE", "SELECT * FROM imports WHERE id = ?"},
		{"SELECT * FROM subscribers WHERE id = ? FOR SHARE", "SELECT * FROM subscribers WHERE id = ?"},
		{"UPDATE imports SET state = 'running' WHERE id = (\n    SELECT id FROM imports\n    LIMIT 1 FOR UPDATE SKIP LOCKED)\nRETURNING *",
			"UPDATE imports SET state = 'running' WHERE id = (\n    SELECT id FROM imports\n    LIMIT 1)\nRETURNING *"},
		{"SELECT id FROM subscribers\nORDER BY id FOR UPDATE", "SELECT id FROM subscribers\nORDER BY id"},
		{"SELECT failing_since FROM webhook_endpoints WHERE id = ?", "SELECT failing_since FROM webhook_endpoints WHERE id = ?"},
	} {
		if got := withoutRowLocks(c.in); got != c.want {
			t.Errorf("withoutRowLocks(%q) = %q, want %q", c.in, got, c.want)
		}
	}
}
