package supervisor_test

import (
	"go/ast"
	"go/importer"
	"go/parser"
	"go/token"
	"go/types"
	"os"
	"path/filepath"
	"sort"
	"strings"
	"testing"
)

// TestPublicAPINamesItsTypes: every type a program using package supervisor
// meets (in an exported signature, field or alias, followed through) is one
// it can name: from a public package, or from an internal one through an
// exported alias in supervisor. Otherwise a caller can receive a value it
// cannot declare (the old []plan.Change, *snapshot.Tree).
func TestPublicAPINamesItsTypes(t *testing.T) {
	fset := token.NewFileSet()
	files := parseNonTest(t, fset, ".")
	conf := types.Config{Importer: importer.ForCompiler(fset, "source", nil)}
	pkg, err := conf.Check("github.com/vmsup/vmsup/supervisor", fset, files, nil)
	if err != nil {
		t.Fatal(err)
	}
	named := map[*types.TypeName]bool{} // internal types supervisor aliases
	for _, n := range pkg.Scope().Names() {
		if tn, ok := pkg.Scope().Lookup(n).(*types.TypeName); ok && tn.Exported() && tn.IsAlias() {
			if nt, ok := types.Unalias(tn.Type()).(*types.Named); ok {
				named[nt.Obj()] = true
			}
		}
	}
	w := &apiWalk{seen: map[types.Type]bool{}, bad: map[string][]string{}, ok: named}
	for _, n := range pkg.Scope().Names() {
		obj := pkg.Scope().Lookup(n)
		if !obj.Exported() {
			continue
		}
		w.walk(obj.Type(), n)
		if tn, ok := obj.(*types.TypeName); ok {
			for _, t := range []types.Type{tn.Type(), types.NewPointer(tn.Type())} {
				ms := types.NewMethodSet(t)
				for i := 0; i < ms.Len(); i++ {
					if m := ms.At(i).Obj(); m.Exported() {
						w.walk(m.Type(), n+"."+m.Name())
					}
				}
			}
		}
	}
	var msgs []string
	for typ, where := range w.bad {
		sort.Strings(where)
		msgs = append(msgs, typ+" (in "+strings.Join(where, ", ")+")")
	}
	sort.Strings(msgs)
	for _, m := range msgs {
		t.Errorf("public API uses an internal type with no exported alias in supervisor: %s", m)
	}
}

func parseNonTest(t *testing.T, fset *token.FileSet, dir string) []*ast.File {
	t.Helper()
	names, err := filepath.Glob(filepath.Join(dir, "*.go"))
	if err != nil {
		t.Fatal(err)
	}
	var files []*ast.File
	for _, n := range names {
		if strings.HasSuffix(n, "_test.go") {
			continue
		}
		src, err := os.ReadFile(n)
		if err != nil {
			t.Fatal(err)
		}
		f, err := parser.ParseFile(fset, n, src, parser.SkipObjectResolution)
		if err != nil {
			t.Fatal(err)
		}
		files = append(files, f)
	}
	return files
}

type apiWalk struct {
	seen map[types.Type]bool
	bad  map[string][]string
	ok   map[*types.TypeName]bool
}

// walk follows t through what a caller can reach: signatures, exported
// fields, elements, and the exported methods of named types.
func (w *apiWalk) walk(t types.Type, where string) {
	t = types.Unalias(t)
	if w.seen[t] {
		return
	}
	w.seen[t] = true
	switch t := t.(type) {
	case *types.Named:
		obj := t.Obj()
		if obj.Pkg() != nil && strings.Contains(obj.Pkg().Path(), "/internal/") && !w.ok[obj] {
			k := obj.Pkg().Path() + "." + obj.Name()
			w.bad[k] = append(w.bad[k], where)
		}
		if obj.Pkg() == nil || !strings.HasPrefix(obj.Pkg().Path(), "github.com/vmsup/vmsup") {
			return // the standard library's and dependencies' types are theirs
		}
		for i := 0; i < t.NumMethods(); i++ {
			if m := t.Method(i); m.Exported() {
				w.walk(m.Type(), where)
			}
		}
		w.walk(t.Underlying(), where)
	case *types.Pointer:
		w.walk(t.Elem(), where)
	case *types.Slice:
		w.walk(t.Elem(), where)
	case *types.Array:
		w.walk(t.Elem(), where)
	case *types.Map:
		w.walk(t.Key(), where)
		w.walk(t.Elem(), where)
	case *types.Chan:
		w.walk(t.Elem(), where)
	case *types.Signature:
		for _, tup := range []*types.Tuple{t.Params(), t.Results()} {
			for i := 0; i < tup.Len(); i++ {
				w.walk(tup.At(i).Type(), where)
			}
		}
	case *types.Struct:
		for i := 0; i < t.NumFields(); i++ {
			if f := t.Field(i); f.Exported() || f.Embedded() {
				w.walk(f.Type(), where)
			}
		}
	case *types.Interface:
		for i := 0; i < t.NumMethods(); i++ {
			if m := t.Method(i); m.Exported() {
				w.walk(m.Type(), where)
			}
		}
	}
}
