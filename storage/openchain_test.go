package storage

import (
	"context"
	"errors"
	"net"
	"os"
	"os/user"
	"path/filepath"
	"strconv"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/vmsup/vmsup/spec"
)

// nbdListener is a TCP listener on a kernel-chosen port that counts the
// connections it accepts: what a backing file nbd://127.0.0.1:PORT/x
// would reach.
func nbdListener(t *testing.T) (addr string, accepted *atomic.Int64) {
	t.Helper()
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { l.Close() })
	accepted = new(atomic.Int64)
	go func() {
		for {
			c, err := l.Accept()
			if err != nil {
				return
			}
			accepted.Add(1)
			c.Close()
		}
	}()
	return l.Addr().String(), accepted
}

// TestOpenDiskRefuses: each way a name-based check was broken (issue 45)
// is refused from the opened object and its header, and DiskFiles (what
// confinement grants) refuses the same chains without running anything or
// connecting anywhere.
func TestOpenDiskRefuses(t *testing.T) {
	needQemuImg(t)
	dir := t.TempDir()
	other := t.TempDir()
	at := func(n string) string { return filepath.Join(dir, n) }
	secret := filepath.Join(other, "secret")
	must(t, os.WriteFile(secret, []byte("root only"), 0o600))
	must(t, os.WriteFile(at("good.raw"), make([]byte, 1<<20), 0o600))
	must(t, os.WriteFile(at("secret-there"), []byte("root only"), 0o600))
	must(t, os.Link(at("secret-there"), at("hard.raw")))
	must(t, os.Symlink(secret, at("link.raw")))
	qemuImg(t, "create", "-q", "-f", "qcow2", at("base.qcow2"), "16M")
	qemuImg(t, "create", "-q", "-f", "qcow2", "-b", "base.qcow2", "-F", "qcow2", at("top.qcow2"))
	qemuImg(t, "create", "-q", "-f", "qcow2", "-o", "data_file="+at("data.raw"), at("datafile.qcow2"), "16M")
	addr, accepted := nbdListener(t)
	qemuImg(t, "create", "-q", "-f", "qcow2", "-u", "-b", "nbd://"+addr+"/x", "-F", "raw", at("nbd.qcow2"), "16M")
	qemuImg(t, "create", "-q", "-f", "qcow2", "-u", "-b", `json:{"file":{"driver":"nbd","host":"127.0.0.1"}}`, "-F", "raw", at("json.qcow2"), "16M")
	qemuImg(t, "create", "-q", "-f", "qcow2", "-u", "-b", "nbd:127.0.0.1:1:exportname=x", "-F", "raw", at("nbdcolon.qcow2"), "16M")
	qemuImg(t, "create", "-q", "-f", "qcow2", "-u", "-b", secret, "-F", "raw", at("outbase.qcow2"), "16M")
	qemuImg(t, "create", "-q", "-f", "qcow2", "-u", "-b", "loop.qcow2", "-F", "qcow2", at("loop.qcow2"), "16M")
	qemuImg(t, "create", "-q", "-f", "qcow2", at("huge.qcow2"), "100T")

	placer := func(path string, base bool) (string, error) {
		if !strings.HasPrefix(path, dir+"/") {
			return "", errors.New(path + " is outside the places")
		}
		return dir, nil
	}
	for _, c := range []struct {
		file, format string
		want         error
		text         string
	}{
		{"hard.raw", "raw", ErrHardLinked, "has more than one hard link"},
		{"link.raw", "raw", ErrNotBeneath, "through a symlink"},
		{"datafile.qcow2", "qcow2", ErrExternalDataFile, "external data file"},
		{"nbd.qcow2", "qcow2", ErrNotLocalBacking, "nbd://"},
		{"json.qcow2", "qcow2", ErrNotLocalBacking, "json:"},
		{"nbdcolon.qcow2", "qcow2", ErrNotLocalBacking, "nbd:127"},
		{"outbase.qcow2", "qcow2", nil, "outside the places"},
		{"loop.qcow2", "qcow2", ErrChainLoop, "loops"},
		{"huge.qcow2", "qcow2", ErrTooLarge, "100T, more than 64T"},
		{"missing.raw", "raw", os.ErrNotExist, "no such file"},
	} {
		d := spec.Disk{Name: "d", Type: spec.DiskFile, File: at(c.file), Format: c.format}
		o, err := OpenDisk(d, placer, OpenLimits{})
		if err == nil || (c.want != nil && !errors.Is(err, c.want)) || !strings.Contains(err.Error(), c.text) {
			o.Close()
			t.Errorf("%s: %v; want %v (%q)", c.file, err, c.want, c.text)
			continue
		}
		t.Logf("%s: %v", c.file, err)
		if c.format == "qcow2" && c.want != ErrTooLarge && c.want != os.ErrNotExist {
			ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
			if files, err := DiskFiles(ctx, d); err == nil && c.want != nil && c.want != ErrChainLoop {
				t.Errorf("DiskFiles of %s: %v, no error", c.file, files)
			}
			cancel()
		}
	}
	o, err := OpenDisk(spec.Disk{Name: "d", Type: spec.DiskFile, File: at("top.qcow2"), Format: "qcow2"}, placer, OpenLimits{})
	if err != nil {
		t.Fatalf("a sound chain: %v", err)
	}
	defer o.Close()
	if len(o.Levels) != 2 || o.Levels[1].Path != at("base.qcow2") || o.Levels[0].Mode != "rwk" || o.Levels[1].Mode != "rk" ||
		o.Levels[1].Header.VirtualSize != 16<<20 {
		t.Errorf("levels: %+v", o.Levels)
	}
	time.Sleep(100 * time.Millisecond) // a connection in flight would be counted by now
	if n := accepted.Load(); n != 0 {
		t.Errorf("the nbd listener accepted %d connections", n)
	}
}

// TestOpenDiskOwner: an image owned by a VM's QEMU user (a file a confined
// QEMU could have written) is refused; one of another owner, such as
// libvirt's libvirt-qemu after libvirt's DAC gave it the image (the bench
// met exactly that), opens.
func TestOpenDiskOwner(t *testing.T) {
	qemuUser, err := user.Lookup("vmsup-qemu")
	if err != nil {
		t.Skipf("no vmsup-qemu user here (scripts/install-deps.sh makes it): %v", err)
	}
	dir := t.TempDir()
	placer := func(string, bool) (string, error) { return dir, nil }
	for _, c := range []struct {
		name string
		uid  string
		want error
	}{{"qemus.raw", qemuUser.Uid, ErrForeignOwner}, {"others.raw", "64055", nil}, {"roots.raw", "0", nil}} {
		p := filepath.Join(dir, c.name)
		if err := os.WriteFile(p, make([]byte, 4096), 0o600); err != nil {
			t.Fatal(err)
		}
		uid, _ := strconv.Atoi(c.uid)
		if err := os.Chown(p, uid, 0); err != nil {
			t.Fatal(err)
		}
		o, err := OpenDisk(spec.Disk{Name: "d", Type: spec.DiskFile, File: p, Format: "raw"}, placer, OpenLimits{})
		if !errors.Is(err, c.want) || (c.want == nil) != (err == nil) {
			t.Errorf("%s (uid %s): %v, want %v", c.name, c.uid, err, c.want)
		}
		if err == nil {
			o.Close()
		}
	}
}
