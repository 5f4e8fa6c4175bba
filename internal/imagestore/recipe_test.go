package imagestore

import (
	"context"
	"crypto/sha256"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"

	"github.com/vmsup/vmsup/internal/dev/testenv"
)

// recipeDoc and recipeSection are where the containerDisk recipes are
// documented.
const (
	recipeDoc     = "docs/images-and-profiles.md"
	recipeSection = "## Building and pushing a containerDisk"
)

// fence is one fenced block of a Markdown file: its info string and text.
type fence struct{ lang, body string }

// recipeFences returns the fenced blocks of the recipes' section, in order.
func recipeFences(t *testing.T) []fence {
	t.Helper()
	root, err := testenv.RepoRoot()
	if err != nil {
		t.Fatal(err)
	}
	data, err := os.ReadFile(filepath.Join(root, recipeDoc))
	if err != nil {
		t.Fatal(err)
	}
	_, section, ok := strings.Cut(string(data), "\n"+recipeSection+"\n")
	if !ok {
		t.Fatalf("%s has no %q", recipeDoc, recipeSection)
	}
	section, _, _ = strings.Cut(section, "\n## ")
	var fences []fence
	var cur *fence
	for _, l := range strings.Split(section, "\n") {
		switch {
		case cur == nil && strings.HasPrefix(l, "```"):
			cur = &fence{lang: strings.TrimPrefix(l, "```")}
		case cur != nil && l == "```":
			fences = append(fences, *cur)
			cur = nil
		case cur != nil:
			cur.body += l + "\n"
		}
	}
	if cur != nil {
		t.Fatalf("%s: an unclosed fence in %q", recipeDoc, recipeSection)
	}
	return fences
}

// containerDiskRecipes sorts the section's blocks: the Containerfile, each
// recipe's commands by the tool they use, and the pull.
type containerDiskRecipes struct {
	containerfile string
	podman, crane []string
	pull          string
}

func parseRecipes(t *testing.T) containerDiskRecipes {
	t.Helper()
	var r containerDiskRecipes
	for _, f := range recipeFences(t) {
		lines := strings.Split(strings.TrimSpace(f.body), "\n")
		switch {
		case f.lang == "dockerfile":
			r.containerfile = f.body
		case f.lang == "sh" && strings.HasPrefix(lines[0], "podman "):
			r.podman = lines
		case f.lang == "sh" && strings.Contains(f.body, "/cmd/crane@"):
			r.crane = lines
		case f.lang == "sh" && len(lines) == 1 && strings.HasPrefix(lines[0], "vmsup image pull "):
			r.pull = lines[0]
		default:
			t.Fatalf("%s: a %q block this test does not know how to run:\n%s", recipeDoc, f.lang, f.body)
		}
	}
	if r.containerfile == "" || r.podman == nil || r.crane == nil || r.pull == "" {
		t.Fatalf("%s: %q lacks a block (Containerfile %t, podman %t, crane %t, pull %t)", recipeDoc, recipeSection,
			r.containerfile != "", r.podman != nil, r.crane != nil, r.pull != "")
	}
	return r
}

// runRecipeLine runs one documented command line with bash in dir,
// REGISTRY standing for addr.
func runRecipeLine(t *testing.T, dir, addr string, env []string, line string) ([]byte, error) {
	t.Helper()
	cmd := exec.Command("bash", "-c", strings.ReplaceAll(line, "REGISTRY", addr))
	cmd.Dir, cmd.Env = dir, append(os.Environ(), env...)
	out, err := cmd.CombinedOutput()
	t.Logf("$ %s\n%s", line, out)
	return out, err
}

// podmanEnv keeps podman's images, state and temporary files in dir (not
// the host's /var/lib/containers) and lets it reach the loopback registry
// at addr over plain HTTP, as the doc says, through the files podman reads.
func podmanEnv(t *testing.T, dir, addr string) []string {
	t.Helper()
	files := map[string]string{
		"storage.conf":    fmt.Sprintf("[storage]\ndriver = \"vfs\"\ngraphroot = %q\nrunroot = %q\n", filepath.Join(dir, "graph"), filepath.Join(dir, "run")),
		"registries.conf": fmt.Sprintf("[[registry]]\nlocation = %q\ninsecure = true\n", addr),
		"containers.conf": fmt.Sprintf("[engine]\ntmp_dir = %q\nevents_logger = \"none\"\n", filepath.Join(dir, "tmp")),
	}
	for name, body := range files {
		if err := os.WriteFile(filepath.Join(dir, name), []byte(body), 0o644); err != nil {
			t.Fatal(err)
		}
	}
	return []string{"CONTAINERS_STORAGE_CONF=" + filepath.Join(dir, "storage.conf"),
		"CONTAINERS_REGISTRIES_CONF=" + filepath.Join(dir, "registries.conf"),
		"CONTAINERS_CONF=" + filepath.Join(dir, "containers.conf")}
}

// goInstallUnreachable says whether go install failed for want of the
// module proxy (the tool cannot be had here), not for the recipe.
func goInstallUnreachable(out []byte) bool {
	for _, s := range []string{"dial tcp", "no such host", "i/o timeout", "connection refused", "GOPROXY=off", "-mod=vendor"} {
		if strings.Contains(string(out), s) {
			return true
		}
	}
	return false
}

// TestContainerDiskRecipes runs the containerDisk recipes of
// docs/images-and-profiles.md as written, each against a registry of its
// own (Debian's docker-registry on loopback, standing for REGISTRY), from a
// directory holding debian-12.qcow2 (a test disk) and the doc's
// Containerfile; then the doc's pull, through the store's Pull with the
// reference and alias of its vmsup line: the image is stored by the disk's
// sha256. podman is skipped where it is not installed, crane where the Go
// module proxy cannot be reached.
func TestContainerDiskRecipes(t *testing.T) {
	rec := parseRecipes(t)
	pull := strings.Fields(rec.pull)
	if len(pull) != 6 || pull[3] != "REGISTRY/disks/debian:12" || pull[4] != "--name" {
		t.Fatalf("the pull %q is not vmsup image pull REGISTRY/disks/debian:12 --name ALIAS", rec.pull)
	}
	disk, sum := testImage(t, "VMSUP-CONTAINERDISK-RECIPE")
	for _, c := range []struct {
		name  string
		lines []string
	}{{"podman", rec.podman}, {"crane", rec.crane}} {
		t.Run(c.name, func(t *testing.T) {
			r := StartTestRegistry(t)
			dir := t.TempDir()
			files := map[string]string{"debian-12.qcow2": string(disk), "Containerfile": rec.containerfile}
			for name, body := range files {
				if err := os.WriteFile(filepath.Join(dir, name), []byte(body), 0o644); err != nil {
					t.Fatal(err)
				}
			}
			var env []string
			if c.name == "podman" {
				if _, err := exec.LookPath("podman"); err != nil {
					t.Skipf("podman is not installed (apt-get install podman; scripts/install-deps.sh installs it): %v", err)
				}
				env = podmanEnv(t, t.TempDir(), r.Addr)
			}
			for _, line := range c.lines {
				if strings.HasPrefix(line, "GOBIN=$PWD go install ") {
					if _, err := exec.LookPath("go"); err != nil {
						t.Skipf("no go in PATH to build crane: %v", err)
					}
				}
				out, err := runRecipeLine(t, dir, r.Addr, env, line)
				if err != nil && strings.Contains(line, " go install ") && goInstallUnreachable(out) {
					t.Skipf("crane cannot be built here (the Go module proxy does not answer): %v", err)
				}
				if err != nil {
					t.Fatalf("%s: %v", line, err)
				}
			}
			s := newStore(t)
			im, err := s.Pull(context.Background(), Pull{Source: strings.ReplaceAll(pull[3], "REGISTRY", r.Addr), Name: pull[5]})
			if err != nil {
				t.Fatalf("%s: %v", rec.pull, err)
			}
			if im.Digest != "sha256:"+sum || im.Format != "qcow2" {
				t.Errorf("pulled %s %s, want the disk's sha256:%s", im.Digest, im.Format, sum)
			}
			if got, err := s.Resolve(pull[5]); err != nil || got.Digest != im.Digest {
				t.Errorf("alias %s: %+v %v", pull[5], got, err)
			}
			if stored, err := os.ReadFile(im.Path); err != nil || sha256.Sum256(stored) != sha256.Sum256(disk) {
				t.Errorf("the stored file %s is not the disk (%v)", im.Path, err)
			}
			t.Logf("%s: stored %s from %s", c.name, im.Digest, im.Source)
		})
	}
}
