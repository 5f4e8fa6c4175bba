package docscheck

import (
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/vmsup/vmsup/spec"
)

// TestQuickstartFileParses: the VM file README's quickstart writes is one
// vmsup takes (parsed and checked as validate does without a host: its
// keys, types and values), with the disks and NIC it says.
func TestQuickstartFileParses(t *testing.T) {
	b, err := os.ReadFile(filepath.Join("..", "..", "README.md"))
	if err != nil {
		t.Fatal(err)
	}
	_, quick, ok := strings.Cut(string(b), "## Quickstart")
	_, rest, ok2 := strings.Cut(quick, "    cat > web.toml <<'EOF'\n")
	body, _, ok3 := strings.Cut(rest, "    EOF\n")
	if !ok || !ok2 || !ok3 {
		t.Fatal("README.md has no quickstart writing web.toml")
	}
	var lines []string
	for _, l := range strings.Split(body, "\n") {
		lines = append(lines, strings.TrimPrefix(l, "    "))
	}
	f, err := spec.Parse("/root/web.toml", []byte(strings.Join(lines, "\n")))
	if err != nil {
		t.Fatalf("README's quickstart file: %v", err)
	}
	vm := f.VM
	if vm.Name != "web" || len(vm.Disks) != 2 || vm.Disks[0].Image != "debian-12" || vm.Disks[1].Type != spec.DiskSeed ||
		!strings.Contains(vm.Disks[1].UserData, "\npassword: debian\n") || len(vm.NICs) != 1 {
		t.Errorf("README's quickstart file parses as %+v", vm)
	}
}
