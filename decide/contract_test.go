package decide

import (
	"go/ast"
	"go/parser"
	"go/token"
	"path/filepath"
	"strconv"
	"strings"
	"testing"
)

// TestContract enforces the package contract (doc.go), lint as a test, on
// decide and its store of legacy records (sent): only the standard
// library, protocol, seqstate, sent and franz-go's error codes; no I/O,
// logging or metrics packages; no clock (time is an argument), no
// goroutine, no channel, no sleeping or timers.
func TestContract(t *testing.T) {
	t.Parallel()
	files, _ := filepath.Glob("*.go")
	inSent, _ := filepath.Glob("sent/*.go")
	files = append(files, inSent...)
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
			case p == "github.com/dedupproxy/dedupproxy/protocol", p == "github.com/dedupproxy/dedupproxy/seqstate",
				p == "github.com/dedupproxy/dedupproxy/decide/sent" && !strings.HasPrefix(path, "sent/"),
				p == "github.com/dedupproxy/dedupproxy/decide/internal/lockcheck",
				p == "github.com/twmb/franz-go/pkg/kerr", p == "net/netip":
			case strings.Contains(first, "."):
				t.Errorf("%s imports %s: decide imports only the standard library, protocol, seqstate, sent and kerr", path, p)
			case p == "log" || p == "log/slog" || p == "net" || strings.HasPrefix(p, "net/") || p == "os" || strings.HasPrefix(p, "os/") || p == "syscall":
				t.Errorf("%s imports %s: decide does no I/O or logging", path, p)
			}
		}
		ast.Inspect(f, func(n ast.Node) bool {
			switch n := n.(type) {
			case *ast.GoStmt:
				t.Errorf("%s: a go statement: decide owns no goroutine", fset.Position(n.Pos()))
			case *ast.ChanType:
				t.Errorf("%s: a channel: decide wakes no one itself (it returns whom to wake)", fset.Position(n.Pos()))
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
