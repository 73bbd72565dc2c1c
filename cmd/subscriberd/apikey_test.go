package main

import (
	"strings"
	"testing"
	"time"
)

// TestCLIKeyScopeAndRotation: apikey create --scope, apikey rotate ID [--grace D] and what
// apikey list shows of them (docs/api-contract.md §16.2), a key past its grace as revoked; a
// revoked or unknown key cannot be rotated, with a clear error (and main's exit status 1).
func TestCLIKeyScopeAndRotation(t *testing.T) {
	t.Parallel()
	env := map[string]string{"DATABASE_URL": pg.Empty(t)}
	cli(t, env, "migrate")
	nl := cli(t, env, "newsletter", "create", "--name", "Keys")["id"].(string)
	w := cli(t, env, "apikey", "create", "--newsletter", nl)
	r := cli(t, env, "apikey", "create", "--newsletter", nl, "--label", "reports", "--scope", "read")
	if w["scope"] != "write" || r["scope"] != "read" {
		t.Errorf("create scopes = %v, %v; want write (the default), read", w["scope"], r["scope"])
	}

	before := time.Now()
	rot := cli(t, env, "apikey", "rotate", r["id"].(string), "--grace", "2h")
	if rot["replaces"] != r["id"] || rot["scope"] != "read" || !strings.HasPrefix(rot["key"].(string), "sk_") || rot["id"] == r["id"] {
		t.Errorf("rotate = %v, want a new read key replacing %v", rot, r["id"])
	}
	exp, err := time.Parse(time.RFC3339, rot["old_key_expires_at"].(string))
	if err != nil || exp.Before(before.Add(2*time.Hour-time.Second)) || exp.After(time.Now().Add(2*time.Hour)) {
		t.Errorf("old_key_expires_at = %v (%v), want 2 h from now", rot["old_key_expires_at"], err)
	}
	def := cli(t, env, "apikey", "rotate", w["id"].(string))
	if exp, _ := time.Parse(time.RFC3339, def["old_key_expires_at"].(string)); exp.Before(before.Add(24*time.Hour - time.Second)) {
		t.Errorf("default grace: old key expires at %v, want 24 h from now", def["old_key_expires_at"])
	}

	keys := cli(t, env, "apikey", "list", "--newsletter", nl)["keys"].([]any)
	if len(keys) != 4 {
		t.Fatalf("apikey list = %v, want 4 keys", keys)
	}
	byID := map[string]map[string]any{}
	for _, k := range keys {
		k := k.(map[string]any)
		byID[k["id"].(string)] = k
		for _, field := range []string{"scope", "last_used_at", "expires_at"} {
			if _, ok := k[field]; !ok {
				t.Errorf("key %v has no %s", k["id"], field)
			}
		}
	}
	if k := byID[r["id"].(string)]; k["scope"] != "read" || k["expires_at"] == nil || k["label"] != "reports" {
		t.Errorf("rotated read key = %v, want scope read with an expiry", k)
	}
	if k := byID[rot["id"].(string)]; k["scope"] != "read" || k["expires_at"] != nil || k["label"] != "reports" || k["last_used_at"] != nil {
		t.Errorf("successor = %v, want scope read, label reports, no expiry, never used", k)
	}

	cli(t, env, "apikey", "revoke", rot["id"].(string))
	const unknown = "0191f0a6-6b5e-7c3a-8f00-000000000009"
	for _, tc := range []struct {
		args []string
		want string
	}{
		{[]string{"apikey", "rotate", rot["id"].(string)}, "apikey rotate: key " + rot["id"].(string) + " is revoked or expired; create a new one with subscriberd apikey create"},
		{[]string{"apikey", "rotate", unknown}, "apikey rotate: no key " + unknown + " (subscriberd apikey list --newsletter ID shows them)"},
		{[]string{"apikey", "rotate"}, "apikey rotate: an ID argument is required"},
		{[]string{"apikey", "rotate", r["id"].(string), "--grace", "-1h"}, "apikey rotate: --grace must not be negative"},
		{[]string{"apikey", "rotate", r["id"].(string), "--grace", "soon"}, `invalid value "soon" for flag -grace`},
		{[]string{"apikey", "create", "--newsletter", nl, "--scope", "admin"}, `apikey create: --scope must be read or write, not "admin"`},
	} {
		if msg, _ := runErr(t, env, tc.args...); !strings.Contains(msg, tc.want) {
			t.Errorf("%v = %q, want it to contain %q", tc.args, msg, tc.want)
		}
	}
	// An expired key (grace 0: at once) cannot be rotated either.
	cli(t, env, "apikey", "rotate", def["id"].(string), "--grace", "0s")
	if msg, _ := runErr(t, env, "apikey", "rotate", def["id"].(string)); !strings.Contains(msg, "is revoked or expired") {
		t.Errorf("rotating an expired key = %q", msg)
	}
	// A rotated key whose grace has ended "is revoked" (§16.2): listed with revoked_at, the
	// end of its grace; one still in its grace is not.
	for _, k := range cli(t, env, "apikey", "list", "--newsletter", nl)["keys"].([]any) {
		k := k.(map[string]any)
		switch k["id"] {
		case def["id"]:
			if k["revoked_at"] == nil || k["revoked_at"] != k["expires_at"] {
				t.Errorf("key past its grace = %v, want revoked_at = expires_at", k)
			}
		case r["id"]:
			if k["revoked_at"] != nil {
				t.Errorf("key in its grace = %v, want revoked_at null", k)
			}
		}
	}
}
