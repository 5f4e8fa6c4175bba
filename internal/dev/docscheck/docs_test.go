// Package docscheck holds the checks that keep the docs true to the code.
package docscheck

import (
	"io/fs"
	"os"
	"path/filepath"
	"strings"
	"testing"
)

// TestArchitectureNamesEveryPackage: docs/architecture.md is where a
// newcomer finds where to change a verb; a package it does not name is a
// place nobody is sent to. Every directory with Go files (test data aside)
// must be named there by its path in backquotes, e.g. `internal/vm/vmstore`
// (a bare substring would let `remoteapi` stand for `remoteapi/client`).
func TestArchitectureNamesEveryPackage(t *testing.T) {
	root := filepath.Join("..", "..", "..")
	doc, err := os.ReadFile(filepath.Join(root, "docs", "architecture.md"))
	if err != nil {
		t.Fatal(err)
	}
	pkgs := map[string]bool{}
	err = filepath.WalkDir(root, func(p string, d fs.DirEntry, err error) error {
		if err != nil {
			return err
		}
		if d.IsDir() && (d.Name() == "testdata" || strings.HasPrefix(d.Name(), ".") && p != root) {
			return filepath.SkipDir
		}
		if !d.IsDir() && strings.HasSuffix(p, ".go") {
			rel, _ := filepath.Rel(root, filepath.Dir(p))
			if rel != "." {
				pkgs[filepath.ToSlash(rel)] = true
			}
		}
		return nil
	})
	if err != nil {
		t.Fatal(err)
	}
	var missing []string
	for p := range pkgs {
		if !strings.Contains(string(doc), "`"+p+"`") {
			missing = append(missing, p)
		}
	}
	if len(missing) > 0 {
		t.Errorf("docs/architecture.md does not name %d packages: %s", len(missing), strings.Join(missing, " "))
	}
}
