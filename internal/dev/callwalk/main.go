// Command callwalk measures the walk of one function through this module: the source files its
// calls reach, the calls that climb back up the import graph, and the calls between supervisor and
// internal/. It is the measure issue 49 asks for ("the walk of up, before and after, measured the
// same way"): run it at the module root of each commit to compare.
//
//	go run ./internal/dev/callwalk [-from 'supervisor.(*Supervisor).Up'] [-live supervisor.New] [-v] [-why name]
//
// What it counts, exactly:
//   - The program is every non-test package of the module (Tests=false) as SSA; the call graph is
//     VTA (golang.org/x/tools/go/callgraph/vta), run twice from CHA, as govulncheck does.
//   - Walked functions are the module's, minus test helpers: packages under internal/dev/ and those
//     whose last path element ends in "test" (supervisortest, remotetest, ...). Closures count as
//     functions of their own (Up$1), generic instances as their origin.
//   - A VTA edge is taken if the call is static; if it goes through a func value, when that function
//     is used as a value in reached code; if it goes through an interface the module declares, when
//     the callee's receiver type is converted to an interface in reached code. "Reached code" is a
//     fixed point over the walk from the package inits, -live and -from. VTA alone is field-based:
//     every steps.Step's func field would call every step of every pipeline.
//   - Calls through interfaces declared outside the module (error, fmt.Stringer, io.Writer) are
//     not taken: VTA merges every wrapped error into one flow. Calls into code outside the module
//     are not followed, but module functions passed to them as arguments (sort, errgroup,
//     sync.Once callbacks) count as called by the caller. Wrappers and thunks are looked through.
//     Reflection is not seen.
//   - files: distinct .go files declaring a function the walk from -from reaches.
//   - climbs back: distinct caller -> callee edges where the callee's package imports the caller's,
//     directly or transitively: a lower package calling up, tagged [interface] (a Host-style
//     adapter) or [func value] (a callback handed down, as to steps.Run or qmp.WaitJob).
//   - supervisor <-> internal: distinct edges from package supervisor into internal/... (down) and
//     from internal/... into supervisor (up); -v lists them. -why NAME prints instead the chain of
//     calls by which the walk first reached each function whose name contains NAME.
package main

import (
	"flag"
	"fmt"
	"go/types"
	"maps"
	"os"
	"path"
	"slices"
	"strings"

	"golang.org/x/tools/go/callgraph"
	"golang.org/x/tools/go/callgraph/cha"
	"golang.org/x/tools/go/callgraph/vta"
	"golang.org/x/tools/go/packages"
	"golang.org/x/tools/go/ssa"
	"golang.org/x/tools/go/ssa/ssautil"
	"golang.org/x/tools/go/types/typeutil"
)

type edge struct{ from, to *ssa.Function }

type walker struct {
	mod, dir string
	prog     *ssa.Program
	cg       *callgraph.Graph
	imports  map[string]map[string]bool // package -> every package it imports, transitively
	liveFn   map[*ssa.Function]bool     // functions used as values in reached code
	liveT    typeutil.Map               // types converted to interfaces in reached code
}

func main() {
	from := flag.String("from", "supervisor.(*Supervisor).Up", "root function: pkg.(*T).Method or pkg.Func, pkg relative to the module")
	live := flag.String("live", "supervisor.New", "comma-separated constructors whose values count as live")
	verbose := flag.Bool("v", false, "also list the supervisor <-> internal edges")
	why := flag.String("why", "", "print instead the chain from the root to each reached function whose name contains this")
	flag.Parse()
	if err := run(*from, *live, *why, *verbose); err != nil {
		fmt.Fprintln(os.Stderr, "callwalk:", err)
		os.Exit(1)
	}
}

func run(from, live, why string, verbose bool) error {
	w, err := load()
	if err != nil {
		return err
	}
	var roots []*ssa.Function
	for _, name := range append([]string{from}, strings.Split(live, ",")...) {
		fn := w.find(name)
		if fn == nil {
			return fmt.Errorf("function %q: not in module %s (want pkg.(*T).Method or pkg.Func)", name, w.mod)
		}
		roots = append(roots, fn)
	}
	for _, p := range w.prog.AllPackages() {
		if init := p.Func("init"); init != nil && w.walked(init) {
			roots = append(roots, init)
		}
	}
	for n := -1; n != len(w.liveFn)+w.liveT.Len(); w.walk(roots) {
		n = len(w.liveFn) + w.liveT.Len()
	}
	reached, edges := w.walk(roots[:1])
	if why != "" {
		w.explain(reached, why)
	} else {
		w.report(from, reached, edges, verbose)
	}
	return nil
}

// load builds the SSA program of the module's non-test packages and its VTA call graph.
func load() (*walker, error) {
	pkgs, err := packages.Load(&packages.Config{Mode: packages.LoadAllSyntax | packages.NeedModule}, "./...")
	if err != nil {
		return nil, fmt.Errorf("load packages: %w", err)
	} else if packages.PrintErrors(pkgs) > 0 || len(pkgs) == 0 || pkgs[0].Module == nil {
		return nil, fmt.Errorf("load packages: not a module that type-checks (errors above)")
	}
	w := &walker{mod: pkgs[0].Module.Path, dir: pkgs[0].Module.Dir, imports: map[string]map[string]bool{}, liveFn: map[*ssa.Function]bool{}}
	packages.Visit(pkgs, nil, func(p *packages.Package) {
		all := map[string]bool{}
		for _, imp := range p.Imports {
			all[imp.PkgPath] = true
			maps.Copy(all, w.imports[imp.PkgPath])
		}
		w.imports[p.PkgPath] = all
	})
	w.prog, _ = ssautil.AllPackages(pkgs, ssa.InstantiateGenerics)
	w.prog.Build()
	entries := map[*ssa.Function]bool{}
	for fn := range ssautil.AllFunctions(w.prog) {
		entries[fn] = w.walked(fn)
	}
	w.cg = cha.CallGraph(w.prog)
	for range 2 { // VTA over what the last graph reaches from the module drops CHA's extra callees
		w.cg = vta.CallGraph(forward(entries, w.cg), w.cg)
	}
	return w, nil
}

// forward returns the functions reachable in cg from entries, entries included.
func forward(entries map[*ssa.Function]bool, cg *callgraph.Graph) map[*ssa.Function]bool {
	seen := map[*ssa.Function]bool{}
	var queue []*ssa.Function
	for fn, in := range entries {
		if in {
			seen[fn], queue = true, append(queue, fn)
		}
	}
	for ; len(queue) > 0; queue = queue[1:] {
		for _, e := range cg.Nodes[queue[0]].Out {
			if !seen[e.Callee.Func] {
				seen[e.Callee.Func], queue = true, append(queue, e.Callee.Func)
			}
		}
	}
	return seen
}

// walk follows calls from roots through walked functions, noting what reached code makes live;
// it returns each reached function with the one that first called it, and the edges (true:
// through an interface).
func (w *walker) walk(roots []*ssa.Function) (map[*ssa.Function]*ssa.Function, map[edge]bool) {
	reached, edges := map[*ssa.Function]*ssa.Function{}, map[edge]bool{}
	for _, fn := range roots {
		reached[fn] = fn
	}
	for queue := slices.Clone(roots); len(queue) > 0; queue = queue[1:] {
		fn := queue[0]
		w.collect(fn)
		for to, iface := range w.callees(fn) {
			edges[edge{fn, to}] = edges[edge{fn, to}] || iface
			if reached[to] == nil {
				reached[to], queue = fn, append(queue, to)
			}
		}
	}
	return reached, edges
}

// collect notes the functions fn uses as values and the types it converts to interfaces.
func (w *walker) collect(fn *ssa.Function) {
	for _, b := range fn.Blocks {
		for _, in := range b.Instrs {
			if mi, ok := in.(*ssa.MakeInterface); ok {
				w.liveT.Set(mi.X.Type(), true)
			}
			call, _ := in.(ssa.CallInstruction)
			for _, op := range in.Operands(nil) {
				if f, ok := (*op).(*ssa.Function); ok && (call == nil || call.Common().Value != f) {
					w.liveFn[f] = true
				}
			}
		}
	}
}

// taken reports whether the walk takes e (see the package comment).
func (w *walker) taken(e *callgraph.Edge) bool {
	c := e.Site.Common()
	switch {
	case c.StaticCallee() != nil:
		return true
	case !c.IsInvoke():
		return w.liveFn[e.Callee.Func]
	case c.Method.Pkg() == nil || !w.inModule(c.Method.Pkg().Path()):
		return false
	}
	recv := e.Callee.Func.Signature.Recv()
	return recv != nil && w.liveT.At(recv.Type()) != nil
}

// callees maps the walked functions fn calls, through wrappers and through code outside the
// module that it hands them to, to whether it calls them through an interface.
func (w *walker) callees(fn *ssa.Function) map[*ssa.Function]bool {
	found, seen := map[*ssa.Function]bool{}, map[*ssa.Function]bool{}
	var add func(c *ssa.Function, iface bool)
	add = func(c *ssa.Function, iface bool) {
		if c.Syntax() == nil && !seen[c] { // a wrapper, thunk or bound method: what it calls
			seen[c] = true
			for _, e := range w.cg.Nodes[c].Out {
				if w.taken(e) {
					add(e.Callee.Func, iface)
				}
			}
		} else if c.Syntax() != nil && w.walked(c) {
			found[c] = found[c] || iface
		}
	}
	for _, e := range w.cg.Nodes[fn].Out {
		clear(seen)
		if c := e.Callee.Func; c.Syntax() != nil && !w.walked(c) {
			for _, a := range e.Site.Common().Args {
				if f := funcValue(a); f != nil {
					add(f, false)
				}
			}
		} else if w.taken(e) {
			add(c, e.Site.Common().IsInvoke())
		}
	}
	return found
}

// funcValue returns the function a call argument is, if it is one.
func funcValue(v ssa.Value) *ssa.Function {
	for {
		switch x := v.(type) {
		case *ssa.ChangeType:
			v = x.X
		case *ssa.MakeInterface:
			v = x.X
		case *ssa.MakeClosure:
			v = x.Fn
		case *ssa.Function:
			return x
		default:
			return nil
		}
	}
}

// pkg is the import path of the package declaring fn.
func pkg(fn *ssa.Function) string {
	for fn.Parent() != nil {
		fn = fn.Parent()
	}
	if o := fn.Origin(); o != nil {
		fn = o
	}
	if o := fn.Object(); o != nil && o.Pkg() != nil {
		return o.Pkg().Path()
	} else if fn.Pkg != nil {
		return fn.Pkg.Pkg.Path()
	}
	return ""
}

func (w *walker) rel(p string) string { return strings.TrimPrefix(p, w.mod+"/") }

func (w *walker) inModule(p string) bool { return p == w.mod || strings.HasPrefix(p, w.mod+"/") }

// walked reports whether fn belongs to the module and not to a test helper.
func (w *walker) walked(fn *ssa.Function) bool {
	p := pkg(fn)
	return w.inModule(p) && !strings.HasPrefix(w.rel(p), "internal/dev/") && !strings.HasSuffix(path.Base(p), "test")
}

func (w *walker) find(name string) *ssa.Function {
	for fn := range w.cg.Nodes {
		if fn != nil && fn.Syntax() != nil && w.walked(fn) && w.name(fn) == name {
			return fn
		}
	}
	return nil
}

// name renders fn as pkg.(*T).Method$1 with pkg relative to the module, the form -from takes.
func (w *walker) name(fn *ssa.Function) string {
	if o := fn.Origin(); o != nil {
		fn = o
	}
	top, s := fn, w.rel(pkg(fn))+"."
	for top.Parent() != nil {
		top = top.Parent()
	}
	if recv := top.Signature.Recv(); recv != nil {
		t, star := recv.Type(), ""
		if p, ok := t.(*types.Pointer); ok {
			t, star = p.Elem(), "*"
		}
		if n, ok := t.(*types.Named); ok {
			t = n.Origin()
		}
		s += "(" + star + types.TypeString(t, func(*types.Package) string { return "" }) + ")."
	}
	return s + fn.Name()
}

func (w *walker) file(fn *ssa.Function) string {
	return strings.TrimPrefix(w.prog.Fset.Position(fn.Pos()).Filename, w.dir+"/")
}

// explain prints, for each reached function whose name contains part, the chain that reached it.
func (w *walker) explain(reached map[*ssa.Function]*ssa.Function, part string) {
	for fn := range reached {
		if !strings.Contains(w.name(fn), part) {
			continue
		}
		chain := w.name(fn)
		for p := fn; reached[p] != p; p = reached[p] {
			chain = w.name(reached[p]) + "\n  -> " + chain
		}
		fmt.Println(chain)
	}
}

func (w *walker) report(from string, reached map[*ssa.Function]*ssa.Function, edges map[edge]bool, verbose bool) {
	files, climbs, pairs, down, up := map[string]bool{}, map[string]bool{}, map[string]bool{}, map[string]bool{}, map[string]bool{}
	for fn := range reached {
		files[w.file(fn)] = true
	}
	sup, internal := w.mod+"/supervisor", w.mod+"/internal/"
	ifaces := 0
	for e, iface := range edges {
		pf, pt := pkg(e.from), pkg(e.to)
		line := fmt.Sprintf("%s (%s) -> %s (%s)", w.name(e.from), w.file(e.from), w.name(e.to), w.file(e.to))
		if pf != pt && w.imports[pt][pf] {
			kind := " [func value]"
			if iface {
				kind, ifaces = " [interface]", ifaces+1
			}
			climbs[line+kind], pairs[pf+" "+pt] = true, true
		}
		if pf == sup && strings.HasPrefix(pt, internal) {
			down[line] = true
		} else if strings.HasPrefix(pf, internal) && pt == sup {
			up[line] = true
		}
	}
	fmt.Printf("walk of %s: %d functions, %d call edges\nfiles: %d\n", from, len(reached), len(edges), len(files))
	printSorted(files)
	fmt.Printf("climbs back: %d edges (%d through interfaces, %d through func values) between %d package pairs\n",
		len(climbs), ifaces, len(climbs)-ifaces, len(pairs))
	printSorted(climbs)
	fmt.Printf("supervisor <-> internal: %d edges down, %d up\n", len(down), len(up))
	if verbose {
		fmt.Println("down:")
		printSorted(down)
		fmt.Println("up:")
		printSorted(up)
	}
}

func printSorted(set map[string]bool) {
	for _, s := range slices.Sorted(maps.Keys(set)) {
		fmt.Println("  " + s)
	}
}
