package fleettest_test

import (
	"crypto/sha256"
	"encoding/hex"
	"net"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/vmsup/vmsup/fleet/fleettest"
	"github.com/vmsup/vmsup/internal/imagestore"
)

// imagePull: a VM whose data disk stands on a stored image that no fleet
// host has: fleet apply records the image's digest and source from the
// applying host's store; the host it is placed on pulls it (from an HTTP
// server on the fleet's LAN) before the start, and the VM runs on an
// overlay of it. Before, such a host failed up with `no image "X" in the
// store` (issue 50).
func imagePull(t *testing.T, f *fleettest.Fleet, dir string) {
	raw, img := filepath.Join(dir, "fleetimg.raw"), filepath.Join(dir, "fleetimg.qcow2")
	if err := os.WriteFile(raw, append([]byte("FLEET-IMAGE"), make([]byte, 1<<20)...), 0o644); err != nil {
		t.Fatal(err)
	}
	if out, err := exec.Command("qemu-img", "convert", "-f", "raw", "-O", "qcow2", raw, img).CombinedOutput(); err != nil {
		t.Fatalf("qemu-img convert: %v: %s", err, out)
	}
	data, err := os.ReadFile(img)
	if err != nil {
		t.Fatal(err)
	}
	sum := sha256.Sum256(data)
	digest := "sha256:" + hex.EncodeToString(sum[:])
	l, err := net.Listen("tcp", net.JoinHostPort(f.LAN.Addr, "0"))
	if err != nil {
		t.Fatal(err)
	}
	srv := &http.Server{Handler: http.FileServer(http.Dir(dir))}
	go srv.Serve(l)
	defer srv.Close()

	// The applying host: a root of its own, whose store has the image.
	cli := append(append([]string{}, f.Env...), "VMSUP_ROOT="+filepath.Join(dir, "cli-root"))
	url := "http://" + l.Addr().String() + "/fleetimg.qcow2"
	if out, err := f.VMSUPEnv(cli, "image", "pull", url, "--sha256", hex.EncodeToString(sum[:]), "--name", "fleetimg"); err != nil {
		t.Fatalf("%v\n%s", err, out)
	}
	vm := quietGuest(t, dir, "imaged", "128M", "")
	b, _ := os.ReadFile(vm)
	body := string(b) + "\n[[disk]]\nname = \"data\"\nfile = \"" + filepath.Join(dir, "imaged-data.qcow2") + "\"\nimage = \"fleetimg\"\n"
	if err := os.WriteFile(vm, []byte(body), 0o644); err != nil {
		t.Fatal(err)
	}
	if out, err := f.VMSUPEnv(cli, "fleet", "apply", vm); err != nil {
		t.Fatalf("%v\n%s", err, out)
	}
	vms := waitLs(t, f, 2*time.Minute, "imaged running", func(m map[string]fleettest.VM) bool { return m["imaged"].State == "running" })
	h := f.Host(vms["imaged"].Host)
	if im, err := (imagestore.Store{Dir: imagestore.Dir(h.Root)}).Resolve("fleetimg"); err != nil || im.Digest != digest {
		t.Errorf("host %s's store: fleetimg is %+v, %v; want %s pulled by the agent", h.Name, im, err, digest)
	}
	if !strings.Contains(h.AgentLog(), "pulling image") {
		t.Errorf("host %s's agent did not say it pulled the image", h.Name)
	}
	if _, err := f.VMSUP("fleet", "rm", "imaged"); err != nil {
		t.Fatal(err)
	}
	waitLs(t, f, time.Minute, "imaged removed", func(m map[string]fleettest.VM) bool { _, ok := m["imaged"]; return !ok })
}
