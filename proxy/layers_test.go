package proxy

import (
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
	{"protocol", "seqstate", "owner", "certprincipal"},
	{"decide"},
	{"config"},
	{"auth"},
	{"tail", "replica", "relay"},
	{"proxy"},
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
