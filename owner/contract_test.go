package owner

import (
	"go/ast"
	"go/parser"
	"go/token"
	"path/filepath"
	"strconv"
	"strings"
	"testing"
)

// TestContract enforces the package contract (doc.go), lint as a test:
// only the standard library; no I/O, logging or metrics packages; no clock
// (time is an argument), no goroutine, no channel, no lock, no sleeping or
// timers.
func TestContract(t *testing.T) {
	t.Parallel()
	files, _ := filepath.Glob("*.go")
	fset := token.NewFileSet()
	for _, path := range files {
		if strings.HasSuffix(path, "_test.go") {
			continue
		}
		f, err := parser.ParseFile(fset, path, nil, 0)
		if err != nil {
			t.Fatal(err)
		}
		for _, imp := range f.Imports {
			p, _ := strconv.Unquote(imp.Path.Value)
			first, _, _ := strings.Cut(p, "/")
			switch {
			case strings.Contains(first, "."):
				t.Errorf("%s imports %s: owner imports only the standard library", path, p)
			case p == "log" || p == "log/slog" || p == "net" || strings.HasPrefix(p, "net/") || p == "os" || strings.HasPrefix(p, "os/") ||
				p == "syscall" || p == "sync" || strings.HasPrefix(p, "sync/"):
				t.Errorf("%s imports %s: owner does no I/O, logging or locking", path, p)
			}
		}
		ast.Inspect(f, func(n ast.Node) bool {
			switch n := n.(type) {
			case *ast.GoStmt:
				t.Errorf("%s: a go statement: owner owns no goroutine", fset.Position(n.Pos()))
			case *ast.ChanType:
				t.Errorf("%s: a channel: owner wakes no one itself (it returns effects)", fset.Position(n.Pos()))
			case *ast.SelectorExpr:
				if x, ok := n.X.(*ast.Ident); ok && x.Name == "time" {
					switch n.Sel.Name {
					case "Now", "Since", "Until", "Sleep", "After", "AfterFunc", "NewTimer", "NewTicker", "Tick":
						t.Errorf("%s: time.%s: time is an argument", fset.Position(n.Pos()), n.Sel.Name)
					}
				}
			}
			return true
		})
	}
}
