package docscheck

import (
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"
)

// layers are internal/'s groups, lowest first, as architecture.md's
// picture draws them: a group imports only groups before it. dev/ (tests
// and tools) stands beside and may import any.
var layers = []string{"util", "vm", "host", "console", "lifecycle", "net", "imagestore", "machine", "ops", "observe"}

// layerExceptions are the imports across groups that go up, each with why
// architecture.md gives.
var layerExceptions = map[string]string{}

// maxTopLevel bounds internal/'s top-level entries (issue 49): a new
// concern goes into the group of its layer.
const maxTopLevel = 12

// TestInternalLayers: internal/ has at most maxTopLevel entries, each a
// group of layers (or dev), and no package imports a group above its own
// but the listed exceptions.
func TestInternalLayers(t *testing.T) {
	root := filepath.Join("..", "..", "..")
	ents, err := os.ReadDir(filepath.Join(root, "internal"))
	if err != nil {
		t.Fatal(err)
	}
	if len(ents) > maxTopLevel {
		t.Errorf("internal/ has %d top-level entries, at most %d: put a new package into the group of its layer", len(ents), maxTopLevel)
	}
	for _, e := range ents {
		if !slices.Contains(layers, e.Name()) && e.Name() != "dev" {
			t.Errorf("internal/%s is no group of architecture.md's layers (%s, dev)", e.Name(), strings.Join(layers, ", "))
		}
	}
	group := func(pkg string) string {
		rest, ok := strings.CutPrefix(pkg, "internal/")
		if !ok {
			return ""
		}
		g, _, _ := strings.Cut(rest, "/")
		return g
	}
	for pkg, imps := range goList(t) {
		from := slices.Index(layers, group(pkg))
		if from < 0 {
			continue // outside internal/, or dev
		}
		for _, imp := range imps {
			to := slices.Index(layers, group(imp))
			if to > from && layerExceptions[pkg+" -> "+imp] == "" {
				t.Errorf("%s imports %s: %s is above %s in architecture.md's layers (%s)", pkg, imp, group(imp), group(pkg), strings.Join(layers, " < "))
			}
		}
	}
}
