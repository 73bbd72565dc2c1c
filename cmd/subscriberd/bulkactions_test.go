package main

import (
	"bytes"
	"encoding/json"
	"fmt"
	"os"
	"path/filepath"
	"regexp"
	"strings"
	"testing"

	"github.com/google/uuid"

	"github.com/subscriberd/subscriberd/internal/logbuf"
	"github.com/subscriberd/subscriberd/model"
	"github.com/subscriberd/subscriberd/repo"
)

// TestBulkActionCommand: "subscriberd bulk-action" with a filter, stdout not a terminal:
// progress lines, then the counts and the action as JSON; the subscribers the filter selects
// hold the tag after, the others not. Bad input is refused before anything starts, with the
// contract's messages.
func TestBulkActionCommand(t *testing.T) {
	t.Parallel()
	env := map[string]string{"DATABASE_URL": pg.Fresh(t)}
	var out bytes.Buffer
	logs := &logbuf.Buffer{}
	if err := run(t.Context(), []string{"newsletter", "create", "--name", "Tagging"}, envFunc(env), &out, logs); err != nil {
		t.Fatalf("newsletter create: %v\n%s", err, logs.String())
	}
	var nl struct{ ID string }
	if err := json.Unmarshal(out.Bytes(), &nl); err != nil {
		t.Fatal(err)
	}
	file := filepath.Join(t.TempDir(), "list.csv")
	var b strings.Builder
	b.WriteString("email,tags\n")
	const rows = 3000
	for i := range rows {
		tag := ""
		if i%3 == 0 {
			tag = "vip"
		}
		fmt.Fprintf(&b, "u%d@example.com,%s\n", i, tag)
	}
	if err := os.WriteFile(file, []byte(b.String()), 0o600); err != nil {
		t.Fatal(err)
	}
	out.Reset()
	if err := run(t.Context(), []string{"import", "--newsletter", nl.ID, file}, envFunc(env), &out, logs); err != nil {
		t.Fatalf("import: %v\n%s", err, logs.String())
	}

	for _, bad := range []struct {
		args []string
		want string
	}{
		{[]string{"--action", "add_tags", "--tags", "x"}, "Exactly one of filter, segment or ids must be provided."},
		{[]string{"--action", "add_tags", "--filter", "{}", "--segment", "0190a8c4-0000-7000-8000-000000000000"}, "Exactly one of filter, segment or ids must be provided."},
		{[]string{"--action", "add_tags", "--filter", "{}"}, "The tags field is required when action is add_tags."},
		{[]string{"--action", "add_tags", "--tags", "x", "--filter", `{"tags":[""]}`}, "The filter.tags.0 field must be between 1 and 64 characters."},
		{[]string{"--action", "add_tags", "--tags", "x", "--segment", "0190a8c4-0000-7000-8000-000000000000"}, "The selected segment is invalid."},
	} {
		out.Reset()
		err := run(t.Context(), append([]string{"bulk-action", "--newsletter", nl.ID}, bad.args...), envFunc(env), &out, logs)
		if err == nil || !strings.Contains(err.Error(), bad.want) {
			t.Errorf("bulk-action %v: %v; want an error saying %q", bad.args, err, bad.want)
		}
	}

	out.Reset()
	if err := run(t.Context(), []string{"bulk-action", "--newsletter", nl.ID, "--action", "add_tags", "--tags", "Gold",
		"--filter", `{"tags":["vip"]}`}, envFunc(env), &out, logs); err != nil {
		t.Fatalf("bulk-action: %v\n%s", err, logs.String())
	}
	text := out.String()
	id := regexp.MustCompile(`^bulk action ([0-9a-f-]{36}): add_tags queued\n`).FindStringSubmatch(text)
	if id == nil {
		t.Fatalf("no first line naming the action:\n%s", text)
	}
	if !regexp.MustCompile(`(?m)^bulk action ` + id[1] + `: (queued|running|completed), \d+ of \d+ subscribers processed$`).MatchString(text) {
		t.Errorf("no progress lines:\n%s", text)
	}
	want := fmt.Sprintf("bulk action %s completed: %d matched: %d changed, 0 unchanged\n", id[1], rows/3, rows/3)
	if !strings.Contains(text, want) {
		t.Errorf("output\n%s\nwant a line %q", text, want)
	}
	lines := strings.Split(strings.TrimSuffix(text, "\n"), "\n")
	var a struct {
		ID     string
		State  string
		Counts map[string]int
	}
	if err := json.Unmarshal([]byte(lines[len(lines)-1]), &a); err != nil || a.ID != id[1] || a.State != "completed" || a.Counts["changed"] != rows/3 {
		t.Errorf("last line %q: %+v (%v), want the action as one JSON object", lines[len(lines)-1], a, err)
	}
	db, err := repo.Open(env["DATABASE_URL"], repo.Options{MaxConns: 1})
	if err != nil {
		t.Fatal(err)
	}
	defer db.Close()
	tags, err := repo.NewSubscribers(db).ListTags(t.Context(), uuid.MustParse(nl.ID), "", 10)
	if err != nil || fmt.Sprint(tags) != fmt.Sprintf("[{gold %d} {vip %d}]", rows/3, rows/3) {
		t.Errorf("tags = %v (%v)", tags, err)
	}

	// A segment target: the segment's members by its filter.
	seg, err := repo.NewSegments(db).Create(t.Context(), uuid.MustParse(nl.ID), model.NewSegment{Name: "VIP",
		Filter: model.Filter{Tags: []string{"vip"}}})
	if err != nil {
		t.Fatal(err)
	}
	out.Reset()
	if err := run(t.Context(), []string{"bulk-action", "--newsletter", nl.ID, "--action", "remove_tags", "--tags", "gold",
		"--segment", seg.ID.String()}, envFunc(env), &out, logs); err != nil {
		t.Fatalf("bulk-action --segment: %v\n%s", err, logs.String())
	}
	if want := fmt.Sprintf(" completed: %d matched: %d changed, 0 unchanged\n", rows/3, rows/3); !strings.Contains(out.String(), want) {
		t.Errorf("output\n%s\nwant a line ending %q", out.String(), want)
	}
}
