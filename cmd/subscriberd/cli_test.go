package main

import (
	"bytes"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/subscriberd/subscriberd/internal/logbuf"
	"github.com/subscriberd/subscriberd/repo"
)

// runErr runs one command that must fail and returns its error text and logs.
func runErr(t *testing.T, env map[string]string, args ...string) (string, string) {
	t.Helper()
	var out, logs bytes.Buffer
	err := run(t.Context(), args, envFunc(env), &out, &logs)
	if err == nil {
		t.Fatalf("%v succeeded, want an error; stdout %s", args, out.String())
	}
	return err.Error(), logs.String()
}

// TestCLIRefusesMissingStore: a command run from another directory, or with a mistyped
// DATABASE_URL, says where it looked instead of creating and using a new empty store.
func TestCLIRefusesMissingStore(t *testing.T) {
	t.Parallel()
	dir := t.TempDir()
	sqlite := repo.SQLiteURL(filepath.Join(dir, "data", sqliteFile))
	for _, tc := range []struct {
		name string
		env  map[string]string
		want string
	}{
		{"sqlite in DATA_DIR", map[string]string{"DATA_DIR": filepath.Join(dir, "data")}, "no database at " + filepath.Join(dir, "data", sqliteFile) + "; set DATA_DIR or DATABASE_URL"},
		{"sqlite url", map[string]string{"DATABASE_URL": sqlite}, "no database at " + filepath.Join(dir, "data", sqliteFile) + "; set DATA_DIR or DATABASE_URL"},
		{"postgres", map[string]string{"DATABASE_URL": pg.Empty(t)}, "; set DATA_DIR or DATABASE_URL, or create it there with subscriberd migrate"},
	} {
		for _, args := range [][]string{
			{"newsletter", "create", "--name", "x"},
			{"newsletter", "list"},
			{"newsletter", "update", "0191f0a6-6b5e-7c3a-8f00-000000000001", "--name", "x"},
			{"apikey", "create", "--newsletter", "0191f0a6-6b5e-7c3a-8f00-000000000001"},
			{"apikey", "list", "--newsletter", "0191f0a6-6b5e-7c3a-8f00-000000000001"},
			{"apikey", "revoke", "0191f0a6-6b5e-7c3a-8f00-000000000001"},
		} {
			if msg, _ := runErr(t, tc.env, args...); !strings.Contains(msg, tc.want) {
				t.Errorf("%s: %v = %q, want it to contain %q", tc.name, args, msg, tc.want)
			}
		}
		if dsn := tc.env["DATABASE_URL"]; dsn != "" {
			if exists, err := repo.DatabaseExists(t.Context(), dsn); err != nil || exists {
				t.Errorf("%s: after the commands the database exists = %v (%v), want nothing created", tc.name, exists, err)
			}
		}
	}
	if _, err := os.Stat(filepath.Join(dir, "data")); !os.IsNotExist(err) {
		t.Errorf("the commands created %s: %v", filepath.Join(dir, "data"), err)
	}
}

// TestMigrateWarnsWhenItCreatesADatabase: a typo in DATABASE_URL makes a new PostgreSQL
// database; migrate says so, naming it.
func TestMigrateWarnsWhenItCreatesADatabase(t *testing.T) {
	t.Parallel()
	dsn := pg.Empty(t)
	if repo.IsSQLite(dsn) {
		t.Skip("TEST_STORE=sqlite: an SQLite file is created without a warning (TestSQLiteFilesAreOwnerOnly covers it)")
	}
	name := databaseName(dsn)
	env := map[string]string{"DATABASE_URL": dsn}
	var out bytes.Buffer
	logs := &logbuf.Buffer{}
	if err := run(t.Context(), []string{"migrate"}, envFunc(env), &out, logs); err != nil {
		t.Fatalf("migrate: %v\n%s", err, logs.String())
	}
	if !strings.Contains(logs.String(), `"level":"WARN","msg":"created the PostgreSQL database`) ||
		!strings.Contains(logs.String(), `"database":"`+name+`"`) {
		t.Errorf("no warning naming the database %s:\n%s", name, logs.String())
	}
	logs.Reset()
	if err := run(t.Context(), []string{"migrate"}, envFunc(env), &out, logs); err != nil {
		t.Fatal(err)
	}
	if strings.Contains(logs.String(), "created the") {
		t.Errorf("the second migrate says it created the database:\n%s", logs.String())
	}
}

// TestSQLiteFilesAreOwnerOnly: the database holds email addresses; its file and the -wal and
// -shm files beside it are readable by their owner only, whatever the umask.
func TestSQLiteFilesAreOwnerOnly(t *testing.T) {
	t.Parallel()
	dir := filepath.Join(t.TempDir(), "data")
	env := map[string]string{"DATA_DIR": dir, "LISTEN_ADDR": "127.0.0.1:0", "ADMIN_ADDR": "127.0.0.1:0"}
	s := startServe(t, env) // migrates: the WAL exists while the store is open
	files := []string{sqliteFile, sqliteFile + "-wal", sqliteFile + "-shm"}
	for _, f := range files {
		st, err := os.Stat(filepath.Join(dir, f))
		if err != nil {
			t.Errorf("%s: %v", f, err)
			continue
		}
		if perm := st.Mode().Perm(); perm != 0o600 {
			t.Errorf("%s has mode %v, want -rw-------", f, perm)
		}
	}
	s.stop(t)
}

// TestCLIListsAndUpdates: newsletter list, apikey list (never the key), and newsletter update
// of the name alone, which keeps api_access as it was.
func TestCLIListsAndUpdates(t *testing.T) {
	t.Parallel()
	env := map[string]string{"DATABASE_URL": pg.Empty(t)}
	cli(t, env, "migrate")
	if got := cli(t, env, "newsletter", "list")["newsletters"]; got == nil || len(got.([]any)) != 0 {
		t.Errorf("newsletter list on an empty store = %v, want []", got)
	}
	a := cli(t, env, "newsletter", "create", "--name", "Alpha", "--api-access=false")
	b := cli(t, env, "newsletter", "create", "--name", "Beta")
	list := cli(t, env, "newsletter", "list")["newsletters"].([]any)
	if len(list) != 2 || list[0].(map[string]any)["id"] != a["id"] || list[1].(map[string]any)["name"] != "Beta" ||
		list[0].(map[string]any)["api_access"] != false || list[0].(map[string]any)["created_at"] == nil {
		t.Errorf("newsletter list = %v", list)
	}

	renamed := cli(t, env, "newsletter", "update", a["id"].(string), "--name", "Alpha Weekly")
	if renamed["name"] != "Alpha Weekly" || renamed["api_access"] != false {
		t.Errorf("update --name = %v, want the new name and api_access still false", renamed)
	}
	// "--api-access false" is the flag (true) and an argument "false": refused, nothing changed.
	if msg, _ := runErr(t, env, "newsletter", "update", a["id"].(string), "--api-access", "false"); msg !=
		`newsletter update: unexpected argument "false" (a true/false flag takes its value after =, as in --api-access=false)` {
		t.Errorf("update --api-access false = %q", msg)
	}
	if msg, _ := runErr(t, env, "newsletter", "create", "--name", "Gamma", "--api-access", "false"); !strings.Contains(msg, `unexpected argument "false"`) {
		t.Errorf("create --api-access false = %q", msg)
	}
	opened := cli(t, env, "newsletter", "update", "--api-access", a["id"].(string))
	if opened["name"] != "Alpha Weekly" || opened["api_access"] != true {
		t.Errorf("update --api-access = %v, want the name kept and api_access true (and false until now)", opened)
	}
	// A flag's value may come before the ID.
	if renamed := cli(t, env, "newsletter", "update", "--name", "Alpha Daily", a["id"].(string)); renamed["name"] != "Alpha Daily" {
		t.Errorf("update --name NAME ID = %v", renamed)
	}
	if msg, _ := runErr(t, env, "newsletter", "update", a["id"].(string)); !strings.Contains(msg, "give --name NAME, --api-access=BOOL or both") {
		t.Errorf("update without changes = %q", msg)
	}

	k1 := cli(t, env, "apikey", "create", "--newsletter", b["id"].(string), "--label", "ci")
	k2 := cli(t, env, "apikey", "create", "--newsletter", b["id"].(string))
	cli(t, env, "apikey", "revoke", k1["id"].(string))
	var out bytes.Buffer
	if err := run(t.Context(), []string{"apikey", "list", "--newsletter", b["id"].(string)}, envFunc(env), &out, &bytes.Buffer{}); err != nil {
		t.Fatal(err)
	}
	for _, k := range []map[string]any{k1, k2} {
		if strings.Contains(out.String(), k["key"].(string)) {
			t.Fatalf("apikey list shows a key: %s", out.String())
		}
	}
	keys := cli(t, env, "apikey", "list", "--newsletter", b["id"].(string))["keys"].([]any)
	if len(keys) != 2 {
		t.Fatalf("apikey list = %v, want 2 keys", keys)
	}
	first, second := keys[0].(map[string]any), keys[1].(map[string]any)
	if first["id"] != k1["id"] || first["prefix"] != k1["prefix"] || first["label"] != "ci" || first["created_at"] == nil || first["revoked_at"] == nil {
		t.Errorf("first key = %v, want k1, labelled ci, revoked", first)
	}
	if second["id"] != k2["id"] || second["revoked_at"] != nil || second["label"] != "" {
		t.Errorf("second key = %v, want k2, live", second)
	}
	if empty := cli(t, env, "apikey", "list", "--newsletter", a["id"].(string))["keys"].([]any); len(empty) != 0 {
		t.Errorf("keys of a newsletter without keys = %v", empty)
	}
	const unknown = "0191f0a6-6b5e-7c3a-8f00-000000000009"
	for _, tc := range []struct {
		args []string
		want string
	}{
		{[]string{"apikey", "list", "--newsletter", unknown}, "apikey list: no newsletter " + unknown + " (subscriberd newsletter list shows them)"},
		{[]string{"apikey", "list"}, "apikey list: --newsletter must be a newsletter id"},
		{[]string{"newsletter", "update", unknown, "--name", "x"}, "no newsletter " + unknown},
		{[]string{"apikey", "revoke", unknown}, "no key " + unknown + " (subscriberd apikey list --newsletter ID shows them)"},
		{[]string{"newsletter", "delete"}, `unknown subcommand "delete" (want create, update or list)`},
		{[]string{"apikey", "create", "--newsletter", b["id"].(string), "junk"}, `apikey create: unexpected argument "junk"`},
		{[]string{"apikey", "revoke", unknown, unknown}, `apikey revoke: unexpected argument "` + unknown + `"`},
		{[]string{"newsletter", "list", "all"}, `newsletter list: unexpected argument "all"`},
		{[]string{"migrate", "now"}, `migrate: unexpected argument "now"`},
		{[]string{"serve", "now"}, `serve: unexpected argument "now"`},
		{[]string{"serve", "--migrate", "false"}, `serve: unexpected argument "false" (a true/false flag takes its value after =, as in --migrate=false)`},
	} {
		if msg, _ := runErr(t, env, tc.args...); !strings.Contains(msg, tc.want) {
			t.Errorf("%v = %q, want it to contain %q", tc.args, msg, tc.want)
		}
	}
}

func TestProgNameIsHowTheUserRanIt(t *testing.T) {
	for arg0, want := range map[string]string{
		"/tmp/go-build3194/b001/exe/subscriberd":               "go run ./cmd/subscriberd",
		"/home/ann/.cache/tmp/go-build77/b001/exe/subscriberd": "go run ./cmd/subscriberd",
		"subscriberd":                "subscriberd",
		"./bin/subscriberd":          "./bin/subscriberd",
		"/usr/local/bin/subscriberd": "/usr/local/bin/subscriberd",
		"":                           "subscriberd",
	} {
		if got := progName(arg0); got != want {
			t.Errorf("progName(%q) = %q, want %q", arg0, got, want)
		}
	}
	// The hints a command prints use it.
	dir := t.TempDir()
	err := runAs(t.Context(), "go run ./cmd/subscriberd", []string{"newsletter", "list"}, envFunc(map[string]string{"DATA_DIR": dir}), &bytes.Buffer{}, &bytes.Buffer{})
	if err == nil || !strings.Contains(err.Error(), "or create it there with go run ./cmd/subscriberd migrate") {
		t.Errorf("hint = %v, want it to name go run ./cmd/subscriberd", err)
	}
}

// TestHelpShowsDefaults: --help names each setting's variable and its default, as a newcomer
// needs them (what runs when nothing is set).
func TestHelpShowsDefaults(t *testing.T) {
	t.Parallel()
	var out, errs bytes.Buffer
	run(t.Context(), []string{"serve", "--help"}, envFunc(nil), &out, &errs) //nolint:errcheck // help ends the command
	help := out.String() + errs.String()
	for _, want := range []string{
		"(env LISTEN_ADDR; default " + defaultListenAddr + ")",
		"(env RATE_LIMITS; default ",
		"(env IDEMPOTENCY_TTL; default " + defaultIdempotencyTTL + ")",
		"0 = it sends none (another instance must) (env EMAIL_WORKERS; default 1)",
		"(env DATABASE_URL)", // no default: SQLite in DATA_DIR, as its usage says
	} {
		if !strings.Contains(help, want) {
			t.Errorf("--help lacks %q:\n%s", want, help)
		}
	}
}
