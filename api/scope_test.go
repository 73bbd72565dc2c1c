package api_test

import (
	"strings"
	"testing"
)

// TestOpenAPIDeclaresScopeOnEveryWrite: every operation that is not a GET declares the 403 a
// read-only key gets, insufficient_scope (docs/api-contract.md §16.2); a GET's 403 names only
// api_access_disabled.
func TestOpenAPIDeclaresScopeOnEveryWrite(t *testing.T) {
	_, doc := openAPIDoc(t)
	writes := 0
	for path, item := range at(t, doc, "paths").(map[string]any) {
		for method, op := range item.(map[string]any) {
			if _, secured := op.(map[string]any)["security"]; !secured {
				continue
			}
			desc, _ := at(t, op, "responses", "403", "description").(string)
			if method == "get" {
				if strings.Contains(desc, "insufficient_scope") {
					t.Errorf("GET %s: 403 %q names insufficient_scope, which a GET never sends", path, desc)
				}
				continue
			}
			writes++
			if !strings.Contains(desc, "insufficient_scope") || !strings.Contains(desc, "This API key can only read.") {
				t.Errorf("%s %s: 403 %q does not declare insufficient_scope", strings.ToUpper(method), path, desc)
			}
		}
	}
	if writes == 0 {
		t.Fatal("no write operation in the document")
	}
}
