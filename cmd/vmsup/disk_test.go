package main

import (
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"
)

// TestCLIDisks: vmsup disk attach (--file and --spec) and detach on a
// running guest, status listing attached disks, one-line errors, and an
// argv with a CHAP disk that shows the secret object but never the password.
func TestCLIDisks(t *testing.T) {
	root, dir := t.TempDir(), t.TempDir()
	const password = "cli-chap-Pa55word"
	secret := write(t, dir, "chap.secret", password+"\n")
	chap := write(t, dir, "chap.toml", guestTOML("chap", fmt.Sprintf(`[[disk]]
name = "lun"
type = "iscsi"
portal = "192.0.2.1"
target = "iqn.2026-01.org.example:t"
lun = 1
user = "u"
secret_file = %q
`, secret)))
	r := vmsup(t, root, "", "argv", chap)
	if r.code != 0 || strings.Contains(r.stdout, password) || !strings.Contains(r.stdout, `"password-secret":"sec-lun"`) ||
		!strings.Contains(r.stdout, `"qom-type":"secret","id":"sec-lun","file":"`+filepath.Join(root, "vms/chap/secrets/lun")+`"`) {
		t.Fatalf("argv of a CHAP disk: %+v", r)
	}

	file := write(t, dir, "hot.toml", guestTOML("hot", ""))
	if r := vmsup(t, root, "", "up", file); r.code != 0 {
		t.Fatalf("up: %+v", r)
	}
	defer vmsup(t, root, "", "down", "hot")
	st := filepath.Join(root, "vms", "hot", "console.log")
	waitFor(t, st, "VMSUP-SHELL-READY", time.Minute)

	// Hot-plugged images lie in an image directory (ROOT/images by default):
	// the confined unit sees nothing else new. Elsewhere is refused clearly.
	if r := vmsup(t, root, "", "disk", "attach", "hot", "--file", filepath.Join(dir, "outside.qcow2"), "--size", "16M"); r.code == 0 ||
		!strings.Contains(r.stderr, "is outside the image directories") {
		t.Fatalf("attach outside the image dirs: %+v", r)
	}
	img := filepath.Join(root, "images", "extra.qcow2")
	if r := vmsup(t, root, "", "disk", "attach", "hot", "--file", img, "--size", "16M", "--serial", "cli-extra"); r.code != 0 ||
		!strings.Contains(r.stdout, "hot: disk extra attached (file on rp1)") {
		t.Fatalf("disk attach --file: %+v", r)
	}
	raw := filepath.Join(root, "images", "raw.img")
	if err := os.WriteFile(raw, make([]byte, 8<<20), 0o600); err != nil {
		t.Fatal(err)
	}
	spec := write(t, dir, "d.toml", "name = \"specdisk\"\nfile = \""+raw+"\"\nserial = \"cli-spec\"\nread_only = true\n")
	if r := vmsup(t, root, "", "disk", "attach", "hot", "--spec", spec); r.code != 0 || !strings.Contains(r.stdout, "hot: disk specdisk attached") {
		t.Fatalf("disk attach --spec: %+v", r)
	}
	if r := vmsup(t, root, "", "status", "hot"); !strings.Contains(r.stdout, "disk:     extra file ") || !strings.Contains(r.stdout, "(raw) read-only hot-plugged") {
		t.Fatalf("status: %+v", r)
	}
	// (The guest seeing hot-plugged disks is shown by supervisor's TestStorageKinds.)
	r = vmsup(t, root, "", "qmp", "hot", `{"execute":"query-named-block-nodes","arguments":{"flat":true}}`)
	if !strings.Contains(r.stdout, `"fmt-extra"`) || !strings.Contains(r.stdout, `"fmt-specdisk"`) {
		t.Fatalf("attached disks are not in QEMU: %+v", r)
	}
	for _, c := range []struct {
		args []string
		want string
	}{
		{[]string{"disk", "attach", "hot", "--file", filepath.Join(dir, "nonexistent", "x.qcow2")}, `vmsup: vm "hot": attach disk "x": disk "x": ` + filepath.Join(dir, "nonexistent", "x.qcow2") + `: no such file`},
		{[]string{"disk", "attach", "hot", "--file", img}, `vmsup: vm "hot": attach disk "extra": the VM already has a disk named "extra" (attached)`},
		{[]string{"disk", "attach", "hot"}, "vmsup: give exactly one of --file and --spec"},
		{[]string{"disk", "detach", "hot", "nosuch"}, `vmsup: vm "hot": detach disk "nosuch": no such attached disk`},
	} {
		r := vmsup(t, root, "", c.args...)
		if line := strings.TrimSuffix(r.stderr, "\n"); r.code == 0 || strings.Contains(line, "\n") || !strings.HasPrefix(line, c.want) {
			t.Errorf("%v: %+v\nwant one line starting %q", c.args, r, c.want)
		}
	}
	for _, d := range []string{"extra", "specdisk"} {
		if r := vmsup(t, root, "", "disk", "detach", "hot", d); r.code != 0 || !strings.Contains(r.stdout, "hot: disk "+d+" detached") {
			t.Fatalf("disk detach %s: %+v", d, r)
		}
	}
	if r := vmsup(t, root, "", "status", "hot"); strings.Contains(r.stdout, "attached:") {
		t.Fatalf("status after detach: %+v", r)
	}
	r = vmsup(t, root, "", "qmp", "hot", `{"execute":"query-named-block-nodes","arguments":{"flat":true}}`)
	if strings.Contains(r.stdout, "-extra\"") || strings.Contains(r.stdout, "-specdisk\"") {
		t.Fatalf("stale block nodes: %s", r.stdout)
	}
}
