package docscheck

import (
	"flag"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"slices"
	"strings"
	"testing"
)

var update = flag.Bool("update", false, "rewrite docs/architecture.md's import columns and importer lists from go list")

// regenerate is how to fix what these tests find.
const regenerate = "go test ./internal/dev/docscheck -run TestArchitectureImports -update"

const module = "github.com/vmsup/vmsup/"

// TestArchitectureImports: each row of docs/architecture.md's package
// tables ("| package | job | imports |") lists exactly the package's
// in-module imports (go list's, test files aside), by path with
// "internal/" left off; every package with code but the test-only ones
// has a row; and each importer list (between <!--importers PKG--> and
// <!--/importers-->) names exactly who imports PKG. With -update the
// imports and lists are rewritten (a note in parentheses after a name is
// kept); the jobs stay the author's.
func TestArchitectureImports(t *testing.T) {
	docPath := filepath.Join("..", "..", "..", "docs", "architecture.md")
	doc, err := os.ReadFile(docPath)
	if err != nil {
		t.Fatal(err)
	}
	imports := goList(t)
	text, problems := checkTables(string(doc), imports)
	text, more := checkImporters(text, imports)
	problems = append(problems, more...)
	if *update {
		if err := os.WriteFile(docPath, []byte(text), 0o644); err != nil {
			t.Fatal(err)
		}
		t.Logf("rewrote %s: %d differences", docPath, len(problems))
		return
	}
	for _, p := range problems {
		t.Errorf("docs/architecture.md: %s", p)
	}
	if len(problems) > 0 {
		t.Logf("to rewrite the import columns and importer lists from go list: %s", regenerate)
	}
}

// goList maps each package of the module ("cmd/vmsup", "internal/vm/vmstore")
// to its in-module imports, test files aside; a package with no non-test
// Go file is left out.
func goList(t *testing.T) map[string][]string {
	t.Helper()
	goBin, err := exec.LookPath("go")
	if err != nil {
		t.Skipf("no go command on PATH to list the packages: %v", err)
	}
	cmd := exec.Command(goBin, "list", "-f", "{{.ImportPath}} {{len .GoFiles}} {{join .Imports \" \"}}", "./...")
	cmd.Dir = filepath.Join("..", "..", "..")
	out, err := cmd.Output()
	if err != nil {
		t.Fatalf("go list: %v", err)
	}
	m := map[string][]string{}
	for _, line := range strings.Split(strings.TrimSpace(string(out)), "\n") {
		f := strings.Fields(line)
		if len(f) < 2 || f[1] == "0" {
			continue
		}
		var in []string
		for _, imp := range f[2:] {
			if strings.HasPrefix(imp, module) {
				in = append(in, strings.TrimPrefix(imp, module))
			}
		}
		m[strings.TrimPrefix(f[0], module)] = in
	}
	return m
}

// testOnly: packages for tests and tools, named in the doc's prose, not
// in a table.
func testOnly(pkg string) bool {
	base := filepath.Base(pkg)
	return strings.HasSuffix(base, "test") || strings.Contains(pkg, "testenv") ||
		pkg == "internal/dev/sandbox" || strings.HasPrefix(pkg, "examples/")
}

// short is a package as the imports column names it: internal/ left off.
func short(pkg string) string { return strings.TrimPrefix(pkg, "internal/") }

// cell is a column's list, generated: the internal packages, then the
// others, each sorted; a note in parentheses the old cell gave a name is
// kept; "-" for none.
func cell(imports []string, old string) string {
	notes := map[string]string{}
	for _, item := range splitList(old) {
		name, note, ok := strings.Cut(item, " (")
		if ok {
			notes[name] = " (" + note
		}
	}
	var internal, public []string
	for _, imp := range imports {
		if strings.HasPrefix(imp, "internal/") {
			internal = append(internal, short(imp)+notes[short(imp)])
		} else {
			public = append(public, imp+notes[imp])
		}
	}
	slices.Sort(internal)
	slices.Sort(public)
	if all := append(internal, public...); len(all) > 0 {
		return strings.Join(all, ", ")
	}
	return "-"
}

// splitList splits a list at its top-level commas (not inside a note).
func splitList(s string) []string {
	var out []string
	depth, start := 0, 0
	for i, r := range s {
		switch r {
		case '(':
			depth++
		case ')':
			depth--
		case ',':
			if depth == 0 {
				out = append(out, strings.TrimSpace(s[start:i]))
				start = i + 1
			}
		}
	}
	if last := strings.TrimSpace(s[start:]); last != "" && last != "-" {
		out = append(out, last)
	}
	return out
}

// names are a list's package names, notes left off.
func names(list string) []string {
	var out []string
	for _, item := range splitList(list) {
		name, _, _ := strings.Cut(item, " (")
		out = append(out, name)
	}
	slices.Sort(out)
	return out
}

var rowPkg = regexp.MustCompile("^\\| `([^`]+)` \\|")

// checkTables compares every package table row's imports with go list's
// and returns the doc with them rewritten, and what differed.
func checkTables(doc string, imports map[string][]string) (string, []string) {
	var problems []string
	rows := map[string]bool{}
	lines := strings.Split(doc, "\n")
	inTable := false
	for i, line := range lines {
		switch {
		case line == "| package | job | imports |":
			inTable = true
			continue
		case !strings.HasPrefix(line, "|"):
			inTable = false
		}
		m := rowPkg.FindStringSubmatch(line)
		if !inTable || m == nil {
			continue
		}
		pkg := m[1]
		rows[pkg] = true
		got, ok := imports[pkg]
		if !ok {
			problems = append(problems, fmt.Sprintf("row %q: no such package with code (go list)", pkg))
			continue
		}
		cut := strings.LastIndex(strings.TrimSuffix(line, " |"), " | ")
		old := strings.TrimSuffix(line[cut+3:], " |")
		want := cell(got, old)
		if !slices.Equal(names(old), names(want)) {
			problems = append(problems, fmt.Sprintf("row %q imports %q, go list says %q", pkg, old, want))
		}
		lines[i] = line[:cut+3] + want + " |"
	}
	for pkg := range imports {
		if !rows[pkg] && !testOnly(pkg) {
			problems = append(problems, fmt.Sprintf("package %q has no row in a package table", pkg))
		}
	}
	slices.Sort(problems)
	return strings.Join(lines, "\n"), problems
}

var importersList = regexp.MustCompile(`<!--importers ([^ ]+)-->(.*?)<!--/importers-->`)

// checkImporters compares each importer list with go list's importers
// (test-only packages aside, which the text names as a group).
func checkImporters(doc string, imports map[string][]string) (string, []string) {
	var problems []string
	out := importersList.ReplaceAllStringFunc(doc, func(s string) string {
		m := importersList.FindStringSubmatch(s)
		var by []string
		for pkg, imps := range imports {
			if slices.Contains(imps, m[1]) && !testOnly(pkg) {
				by = append(by, pkg)
			}
		}
		slices.Sort(by)
		old := strings.ReplaceAll(m[2], "`", "")
		if !slices.Equal(names(strings.ReplaceAll(old, " and ", ", ")), by) {
			problems = append(problems, fmt.Sprintf("%s is imported by %s, not %s", m[1], strings.Join(by, ", "), old))
		}
		quoted := make([]string, len(by))
		for i, p := range by {
			quoted[i] = "`" + p + "`"
		}
		return "<!--importers " + m[1] + "-->" + strings.Join(quoted, ", ") + "<!--/importers-->"
	})
	if !strings.Contains(doc, "<!--importers supervisor-->") {
		problems = append(problems, "no importer list of supervisor (<!--importers supervisor-->...<!--/importers-->)")
	}
	return out, problems
}
