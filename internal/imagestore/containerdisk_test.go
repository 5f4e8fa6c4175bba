package imagestore

import (
	"context"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
	"time"
)

// TestContainerDiskBuilt: a containerDisk built and pushed as
// docs/images-and-profiles.md says (its Containerfile, podman build and
// push) pulls into the store as the disk file it holds.
func TestContainerDiskBuilt(t *testing.T) {
	podman, err := exec.LookPath("podman")
	if err != nil {
		t.Skip("podman not found (apt-get install podman): the documented build is not tried")
	}
	containerfile := docContainerfile(t)
	r := StartTestRegistry(t)
	img, sum := testImage(t, "VMSUP-PODMAN")
	dir := t.TempDir()
	for name, b := range map[string][]byte{"debian-12.qcow2": img, "Containerfile": []byte(containerfile)} {
		if err := os.WriteFile(filepath.Join(dir, name), b, 0o644); err != nil {
			t.Fatal(err)
		}
	}
	ctx, cancel := context.WithTimeout(context.Background(), 3*time.Minute)
	defer cancel()
	ref := r.Addr + "/vms/debian:12"
	run := func(args ...string) {
		t.Helper()
		cmd := exec.CommandContext(ctx, podman, args...)
		cmd.Dir = dir
		if out, err := cmd.CombinedOutput(); err != nil {
			t.Fatalf("podman %s: %v\n%s", strings.Join(args, " "), err, out)
		}
	}
	run("build", "-q", "-t", ref, ".")
	t.Cleanup(func() { exec.Command(podman, "rmi", "-f", ref).Run() })
	run("push", "-q", "--tls-verify=false", ref)
	im, err := newStore(t).Pull(ctx, Pull{Source: ref, Insecure: true, Name: "debian-12"})
	if err != nil {
		t.Fatal(err)
	}
	if im.Digest != "sha256:"+sum || im.Format != "qcow2" || len(im.Aliases) != 1 {
		t.Errorf("pulled %+v, want the disk file's sha256:%s as debian-12", im, sum)
	}
}

// docContainerfile is the Containerfile of the how-to in
// docs/images-and-profiles.md (the here-document it writes).
func docContainerfile(t *testing.T) string {
	t.Helper()
	b, err := os.ReadFile(filepath.Join("..", "..", "docs", "images-and-profiles.md"))
	if err != nil {
		t.Fatal(err)
	}
	_, rest, ok := strings.Cut(string(b), "    cat > Containerfile <<'EOF'\n")
	body, _, ok2 := strings.Cut(rest, "    EOF\n")
	if !ok || !ok2 {
		t.Fatal("docs/images-and-profiles.md has no Containerfile here-document")
	}
	var out []string
	for _, l := range strings.Split(strings.TrimSuffix(body, "\n"), "\n") {
		out = append(out, strings.TrimPrefix(l, "    "))
	}
	return strings.Join(out, "\n") + "\n"
}
