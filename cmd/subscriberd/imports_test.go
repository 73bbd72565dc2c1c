package main

import (
	"bufio"
	"bytes"
	"encoding/json"
	"fmt"
	"os"
	"path/filepath"
	"regexp"
	"strings"
	"testing"

	"github.com/subscriberd/subscriberd/internal/logbuf"
	"github.com/subscriberd/subscriberd/repo"
)

// TestImportCommand: 200,000 rows (20,000 under -race or -short) through "subscriberd import", stdout
// not a terminal: plain progress lines, then the counts and where the row errors are. Every row is
// accounted for.
func TestImportCommand(t *testing.T) {
	t.Parallel()
	// 200,000 rows are 200 batches: many progress lines, and a volume at which a slow statement
	// shows. That took 71-226 s on a loaded 2-core machine without the race detector, which
	// makes it several times slower still; CI runs everything with -race on 2 cores within 90
	// minutes. Under -race (or -short) 20,000 rows, 20 batches, still cross every batch
	// boundary and the same duplicate and invalid rows (one of each per 1,000; keep rows a
	// multiple of 1,000); the race detector needs the code paths, not the volume.
	rows := 200_000
	if raceEnabled || testing.Short() {
		rows = 20_000
	}
	env := map[string]string{"DATABASE_URL": pg.Fresh(t)}
	var out bytes.Buffer
	logs := &logbuf.Buffer{}
	if err := run(t.Context(), []string{"newsletter", "create", "--name", "Moving in"}, envFunc(env), &out, logs); err != nil {
		t.Fatalf("newsletter create: %v\n%s", err, logs.String())
	}
	var nl struct{ ID string }
	if err := json.Unmarshal(out.Bytes(), &nl); err != nil {
		t.Fatal(err)
	}
	file := filepath.Join(t.TempDir(), "list.csv")
	f, err := os.Create(file)
	if err != nil {
		t.Fatal(err)
	}
	w := bufio.NewWriter(f)
	fmt.Fprintln(w, "email,name")
	for i := range rows {
		switch {
		case i%1000 == 7:
			fmt.Fprintf(w, "broken-%d,Nobody\n", i) // invalid
		case i%1000 == 8:
			fmt.Fprintf(w, "USER%d@example.com,Again\n", i-2) // an earlier row, again
		default:
			fmt.Fprintf(w, "user%d@example.com,User %d\n", i, i)
		}
	}
	if err := w.Flush(); err != nil {
		t.Fatal(err)
	}
	f.Close()

	out.Reset()
	if err := run(t.Context(), []string{"import", "--newsletter", nl.ID, file}, envFunc(env), &out, logs); err != nil {
		t.Fatalf("import: %v\n%s", err, logs.String())
	}
	text := out.String()
	id := regexp.MustCompile(fmt.Sprintf(`^import ([0-9a-f-]{36}): %d rows stored\n`, rows)).FindStringSubmatch(text)
	if id == nil {
		t.Fatalf("no first line naming the import:\n%s", text)
	}
	if !regexp.MustCompile(`(?m)^import ` + id[1] + `: (queued|running|completed), \d+ of ` + fmt.Sprint(rows) + ` rows processed$`).MatchString(text) {
		t.Errorf("no progress lines:\n%s", text)
	}
	invalid, existing := rows/1000, rows/1000
	wantEnd := fmt.Sprintf("import %s completed: %d rows: %d created, %d existing, 0 suppressed, %d invalid\nrow errors: GET /api/v1/imports/%s/errors\n",
		id[1], rows, rows-invalid-existing, existing, invalid, id[1])
	lines := strings.SplitAfter(strings.TrimSuffix(text, "\n"), "\n")
	last := lines[len(lines)-1]
	if !strings.HasSuffix(strings.TrimSuffix(text, last+"\n"), wantEnd) {
		t.Errorf("output ends\n%s\nwant\n%s<the import as JSON>", text[max(0, len(text)-500):], wantEnd)
	}
	var imp struct {
		ID     string
		State  string
		Counts map[string]int
	}
	if err := json.Unmarshal([]byte(last), &imp); err != nil || imp.ID != id[1] || imp.State != "completed" || imp.Counts["invalid"] != invalid {
		t.Errorf("last line %q: %+v (%v), want the import as one JSON object", last, imp, err)
	}
	db, err := repo.Open(env["DATABASE_URL"], repo.Options{MaxConns: 1})
	if err != nil {
		t.Fatal(err)
	}
	defer db.Close()
	var n int
	if err := db.NewRaw("SELECT count(*) FROM subscribers").Scan(t.Context(), &n); err != nil || n != rows-invalid-existing {
		t.Errorf("%d subscribers (%v), want %d", n, err, rows-invalid-existing)
	}
	if err := db.NewRaw("SELECT count(*) FROM import_errors").Scan(t.Context(), &n); err != nil || n != invalid {
		t.Errorf("%d row errors (%v), want %d", n, err, invalid)
	}
}
