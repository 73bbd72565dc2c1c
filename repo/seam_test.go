package repo

import (
	"go/ast"
	"go/parser"
	"go/token"
	"path/filepath"
	"slices"
	"strings"
	"testing"
)

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

// engineFiles are the engines' own files, sharedFiles the seam and what both sides use; every
// other file of the package is a store's.
var (
	engineFiles = []string{"pg.go", "sqlite.go"}
	sharedFiles = []string{"db.go", "engine.go", "tx.go", "tracing.go"}
)

// TestSeamRunsOneWay: the engine files name nothing the stores' files declare and define
// methods of their own types only, and the stores' files name nothing the engine files
// declare (ARCHITECTURE.md habit 18): what crosses the seam is declared in engine.go or
// another shared file.
func TestSeamRunsOneWay(t *testing.T) {
	fset := token.NewFileSet()
	names, err := filepath.Glob("*.go")
	if err != nil {
		t.Fatal(err)
	}
	files := map[string]*ast.File{}
	for _, name := range names {
		if strings.HasSuffix(name, "_test.go") {
			continue
		}
		f, err := parser.ParseFile(fset, name, nil, 0)
		if err != nil {
			t.Fatal(err)
		}
		files[name] = f
	}
	side := func(name string) string {
		switch base := filepath.Base(name); {
		case slices.Contains(engineFiles, base):
			return "engine"
		case slices.Contains(sharedFiles, base):
			return "shared"
		}
		return "store"
	}
	declared := map[string]map[string]string{"engine": {}, "store": {}} // side → name → file
	var engineMethods []*ast.FuncDecl
	for name, f := range files {
		s := side(name)
		if s == "shared" {
			continue
		}
		for _, d := range f.Decls {
			switch d := d.(type) {
			case *ast.FuncDecl:
				if d.Recv == nil {
					declared[s][d.Name.Name] = name
					continue
				}
				if s == "engine" { // checked below: of its own types only
					engineMethods = append(engineMethods, d)
				}
			case *ast.GenDecl:
				for _, sp := range d.Specs {
					switch sp := sp.(type) {
					case *ast.TypeSpec:
						declared[s][sp.Name.Name] = name
					case *ast.ValueSpec:
						for _, n := range sp.Names {
							declared[s][n.Name] = name
						}
					}
				}
			}
		}
	}
	for _, d := range engineMethods {
		ast.Inspect(d.Recv, func(n ast.Node) bool {
			if id, ok := n.(*ast.Ident); ok && id.Obj == nil && declared["engine"][id.Name] == "" {
				t.Errorf("%s: engine file defines a method of %s, not an engine's type", fset.Position(id.Pos()), id.Name)
			}
			return true
		})
	}
	for name, f := range files {
		var other string
		switch side(name) {
		case "engine":
			other = "store"
		case "store":
			other = "engine"
		default:
			continue
		}
		skip := map[*ast.Ident]bool{}
		ast.Inspect(f, func(n ast.Node) bool {
			switch n := n.(type) {
			case *ast.SelectorExpr:
				skip[n.Sel] = true // a field or method, or another package's name
			case *ast.KeyValueExpr:
				if id, ok := n.Key.(*ast.Ident); ok {
					skip[id] = true // a field of a composite literal
				}
			case *ast.Ident:
				// Unresolved in its file: declared at the package's level elsewhere (or
				// predeclared).
				if !skip[n] && n.Obj == nil {
					checkIdent(t, fset, n, declared[other], side(name)+" file names what "+other+" file declares:")
				}
			}
			return true
		})
	}
}

func checkIdent(t *testing.T, fset *token.FileSet, id *ast.Ident, declared map[string]string, what string) {
	t.Helper()
	if file, ok := declared[id.Name]; ok && id.Name != "_" {
		t.Errorf("%s: %s %s (%s)", fset.Position(id.Pos()), what, id.Name, file)
	}
}
