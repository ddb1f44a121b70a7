package proxy

import (
	"go/ast"
	"go/parser"
	"go/token"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"testing"
)

// layers lists the module's packages bottom up (docs/architecture.md, "The
// packages"): a package imports only packages of layers below its own,
// never one of its own layer or above, so imports run one way and no cycle
// can form.
var layers = [][]string{
	{"protocol", "seqstate", "owner", "certprincipal", "clock", "decide/internal/lockcheck"},
	{"decide/sent", "protocol/rewrite"},
	{"decide"},
	{"config"},
	{"auth"},
	{"tail", "replica", "relay"},
	{"metrics"},
	{"nodes"},
	{"proxy"},
	// The simulation (a tool nothing imports): the world above the checks,
	// above the client models, above the cluster.
	{"sim/kafka"},
	{"sim/client"},
	{"sim/check"},
	{"sim"},
}

const module = "github.com/dedupproxy/dedupproxy/"

// TestImportsOneWay reads the imports of every layered package's non-test
// files (whatever their build constraints) and fails on one that points
// sideways or up, or at a package of the module no layer lists.
func TestImportsOneWay(t *testing.T) {
	t.Parallel()
	layerOf := map[string]int{}
	for i, l := range layers {
		for _, p := range l {
			layerOf[p] = i
		}
	}
	for pkg, at := range layerOf {
		files, err := filepath.Glob(filepath.Join("..", pkg, "*.go"))
		if err != nil || len(files) == 0 {
			t.Fatalf("package %s: no files (%v)", pkg, err)
		}
		for _, f := range files {
			if strings.HasSuffix(f, "_test.go") {
				continue
			}
			src, err := os.ReadFile(f)
			if err != nil {
				t.Fatal(err)
			}
			af, err := parser.ParseFile(token.NewFileSet(), f, src, parser.ImportsOnly)
			if err != nil {
				t.Fatal(err)
			}
			for _, imp := range af.Imports {
				path, _ := strconv.Unquote(imp.Path.Value)
				dep, ok := strings.CutPrefix(path, module)
				if !ok {
					continue
				}
				switch l, listed := layerOf[dep]; {
				case !listed:
					t.Errorf("%s imports %s, which no layer lists", f, dep)
				case l >= at:
					t.Errorf("%s (layer %d) imports %s (layer %d): imports run downwards only", f, at, dep, l)
				}
			}
		}
	}
}

// clockFuncs are the time package's functions that read the clock or wait
// on it.
var clockFuncs = map[string]bool{"Now": true, "Since": true, "Until": true, "NewTimer": true, "NewTicker": true,
	"After": true, "AfterFunc": true, "Tick": true, "Sleep": true}

// TestClockInjected fails on a non-test file of a layered package (or of
// the command or the audit), other than package clock's, that reads the
// clock or waits on it through the time package: the proxy's time comes
// from its clock.Clock (package clock says which clock is for what).
func TestClockInjected(t *testing.T) {
	t.Parallel()
	// The command and the audit read the clock through package clock too;
	// the bench, which measures wall time, and tests are left out.
	for _, l := range append(layers, []string{"cmd/dedupproxy", "audit"}) {
		for _, pkg := range l {
			if pkg == "clock" {
				continue
			}
			files, err := filepath.Glob(filepath.Join("..", pkg, "*.go"))
			if err != nil {
				t.Fatal(err)
			}
			for _, f := range files {
				if strings.HasSuffix(f, "_test.go") {
					continue
				}
				fset := token.NewFileSet()
				af, err := parser.ParseFile(fset, f, nil, 0)
				if err != nil {
					t.Fatal(err)
				}
				timePkg := ""
				for _, imp := range af.Imports {
					if imp.Path.Value == `"time"` {
						timePkg = "time"
						if imp.Name != nil {
							timePkg = imp.Name.Name
						}
					}
				}
				if timePkg == "" {
					continue
				}
				ast.Inspect(af, func(n ast.Node) bool {
					if sel, ok := n.(*ast.SelectorExpr); ok {
						if id, ok := sel.X.(*ast.Ident); ok && id.Name == timePkg && clockFuncs[sel.Sel.Name] {
							t.Errorf("%s: time.%s: take the time from a clock.Clock", fset.Position(sel.Pos()), sel.Sel.Name)
						}
					}
					return true
				})
			}
		}
	}
}
