package storage

import (
	"context"
	"errors"
	"os"
	"os/exec"
	"path/filepath"
	"testing"
	"time"
)

// TestLocalInfoAgreesWithQemuImg: for each image kind vmsup reads itself,
// its header reading says what qemu-img info says; the others are left to
// qemu-img; an image held for writing is refused as qemu-img refuses it.
func TestLocalInfoAgreesWithQemuImg(t *testing.T) {
	tools := needQemuImg(t)
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	dir := t.TempDir()
	at := func(n string) string { return filepath.Join(dir, n) }
	qemuImg(t, "create", "-q", "-f", "raw", at("raw.img"), "3M")
	qemuImg(t, "create", "-q", "-f", "qcow2", at("v3.qcow2"), "64M")
	qemuImg(t, "create", "-q", "-f", "qcow2", "-o", "compat=0.10", at("v2.qcow2"), "32M")
	qemuImg(t, "create", "-q", "-f", "qcow2", "-b", at("v3.qcow2"), "-F", "qcow2", at("abs.qcow2"))
	qemuImg(t, "create", "-q", "-f", "qcow2", "-b", "v2.qcow2", "-F", "qcow2", "-o", "compat=0.10", at("rel.qcow2"))
	qemuImg(t, "create", "-q", "-f", "qcow2", "-b", at("raw.img"), "-F", "raw", "-o", "extended_l2=on", at("onraw.qcow2"))
	if err := os.WriteFile(at("w.qcow2"), []byte("not an image"), 0o600); err != nil {
		t.Fatal(err)
	}
	for _, c := range []struct {
		file, format string
		local        bool
	}{
		{"raw.img", "raw", true},
		{"v3.qcow2", "qcow2", true},
		{"v2.qcow2", "qcow2", true},
		{"abs.qcow2", "qcow2", true},
		{"rel.qcow2", "qcow2", true},
		{"onraw.qcow2", "qcow2", true},
		{"v3.qcow2", "raw", true},   // declared raw: read as raw, as QEMU will
		{"w.qcow2", "qcow2", false}, // not qcow2: qemu-img says so
		{"v3.qcow2", "", false},     // probing is qemu-img's
	} {
		got, ok, err := localInfo(at(c.file), c.format)
		if err != nil || ok != c.local {
			t.Errorf("%s as %q: ok %v err %v, want ok %v", c.file, c.format, ok, err, c.local)
			continue
		}
		if !ok {
			continue
		}
		want, err := tools.Info(ctx, at(c.file), c.format)
		if err != nil {
			t.Fatalf("qemu-img info %s: %v", c.file, err)
		}
		if got != want {
			t.Errorf("%s as %q:\n local    %+v\n qemu-img %+v", c.file, c.format, got, want)
		}
	}
	chain, err := tools.Chain(ctx, at("rel.qcow2"), "qcow2")
	if err != nil || len(chain) != 2 || chain[1].Filename != at("v2.qcow2") {
		t.Errorf("chain of rel.qcow2: %+v, %v", chain, err)
	}

	// A writer (qemu-io keeps the image open read-write until its stdin ends).
	qio, err := exec.LookPath("qemu-io")
	if err != nil {
		t.Skip("no qemu-io for the lock case (apt-get install qemu-utils)")
	}
	cmd := exec.Command(qio, "-f", "qcow2", at("abs.qcow2"))
	stdin, err := cmd.StdinPipe()
	if err != nil {
		t.Fatal(err)
	}
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	defer func() { stdin.Close(); cmd.Wait() }()
	deadline := time.Now().Add(10 * time.Second)
	for {
		if l, _ := WriteLocked(at("abs.qcow2")); l {
			break
		}
		if time.Now().After(deadline) {
			t.Fatal("qemu-io never took the write lock")
		}
		time.Sleep(20 * time.Millisecond)
	}
	_, ok, err := localInfo(at("abs.qcow2"), "qcow2")
	if !ok || !errors.Is(err, ErrInUse) {
		t.Errorf("held image: ok %v err %v, want ErrInUse", ok, err)
	}
	if _, err := tools.Info(ctx, at("abs.qcow2"), "qcow2"); !errors.Is(err, ErrInUse) {
		t.Errorf("qemu-img on the held image: %v, want ErrInUse", err)
	}
	// Its base is only read by the writer: both still read it.
	if _, ok, err := localInfo(at("v3.qcow2"), "qcow2"); !ok || err != nil {
		t.Errorf("base of the held image: ok %v err %v", ok, err)
	}
}
