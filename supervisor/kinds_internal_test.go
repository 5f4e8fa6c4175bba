package supervisor

import (
	"go/ast"
	"go/parser"
	"go/token"
	"io/fs"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"testing"

	"github.com/vmsup/vmsup/internal/lifecycle/operation"
)

// TestEveryKindHasARecoverer: every operation kind declared in the module
// (a constant of type operation.Kind) has a recoverer in the kernel that
// runs it, so Begin never refuses it and a kill never leaves a journal
// that only a give-up settles. The networks' kinds run in their own kernel.
func TestEveryKindHasARecoverer(t *testing.T) {
	s, err := New(Options{Root: t.TempDir()})
	if err != nil {
		t.Fatal(err)
	}
	vms, nets := s.env.Ops().Kinds(), s.Networks().Kinds()
	declared := declaredKinds(t, "..")
	if len(declared) < 20 {
		t.Fatalf("found only %d kinds in the source: %v (the walk is broken)", len(declared), declared)
	}
	for where, kind := range declared {
		registered := slices.Contains(vms, kind)
		if strings.HasPrefix(where, "internal/net/netmanage/") {
			registered = slices.Contains(nets, string(kind))
		}
		if !registered {
			t.Errorf("%s: operation kind %q has no recoverer registered (registerRecoverers)", where, kind)
		}
	}
}

// declaredKinds maps "FILE: NAME" to the value of every constant of type
// operation.Kind in the module's non-test Go files below root.
func declaredKinds(t *testing.T, root string) map[string]operation.Kind {
	t.Helper()
	out := map[string]operation.Kind{}
	fset := token.NewFileSet()
	err := filepath.WalkDir(root, func(p string, d fs.DirEntry, err error) error {
		if err != nil || d.IsDir() && (d.Name() == "testdata" || strings.HasPrefix(d.Name(), ".") && p != root) {
			return err
		}
		if d.IsDir() || !strings.HasSuffix(p, ".go") || strings.HasSuffix(p, "_test.go") {
			return nil
		}
		f, err := parser.ParseFile(fset, p, nil, parser.SkipObjectResolution)
		if err != nil {
			return err
		}
		rel, _ := filepath.Rel(root, p)
		for _, decl := range f.Decls {
			if g, ok := decl.(*ast.GenDecl); ok && g.Tok == token.CONST {
				addKinds(out, filepath.ToSlash(rel), g)
			}
		}
		return nil
	})
	if err != nil {
		t.Fatal(err)
	}
	return out
}

func addKinds(out map[string]operation.Kind, file string, g *ast.GenDecl) {
	for _, spec := range g.Specs {
		vs := spec.(*ast.ValueSpec)
		sel, ok := vs.Type.(*ast.SelectorExpr)
		if !ok || sel.Sel.Name != "Kind" {
			continue
		}
		if x, ok := sel.X.(*ast.Ident); !ok || x.Name != "operation" {
			continue
		}
		for i, v := range vs.Values {
			if lit, ok := v.(*ast.BasicLit); ok && lit.Kind == token.STRING {
				val, _ := strconv.Unquote(lit.Value)
				out[file+": "+vs.Names[i].Name] = operation.Kind(val)
			}
		}
	}
}
