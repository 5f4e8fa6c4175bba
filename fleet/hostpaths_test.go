package fleet

import (
	"fmt"
	"log/slog"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/vmsup/vmsup/spec"
	"github.com/vmsup/vmsup/supervisor"
)

// TestAgentRefusesHostPaths: a spec in etcd naming a path outside the
// agent's host's places (/etc/shadow as it is, through a symlink in an
// image directory, by ".." out of one) is reported invalid with the
// reason, and never started: the agent checks its own host, whatever the
// client that wrote the spec checked.
func TestAgentRefusesHostPaths(t *testing.T) {
	s := newStore(t)
	ctx := t.Context()
	root := t.TempDir()
	images := filepath.Join(root, "images")
	if err := os.MkdirAll(images, 0o711); err != nil {
		t.Fatal(err)
	}
	link := filepath.Join(images, "shadow.raw")
	if err := os.Symlink("/etc/shadow", link); err != nil {
		t.Fatal(err)
	}
	sup, err := supervisor.New(supervisor.Options{Root: root, SystemdBus: "unix:path=/nonexistent/bus", Self: "/bin/true"})
	if err != nil {
		t.Fatal(err)
	}
	defer sup.Close()
	a := &Agent{Store: s, Sup: sup, Host: Host{Name: "h1"}, State: t.TempDir(), Log: slog.New(slog.DiscardHandler)}
	paths := []string{"/etc/shadow", link, images + "/../../../../../../../../etc/shadow"}
	for i, p := range paths {
		name := fmt.Sprintf("v%d", i)
		f, err := spec.Parse(filepath.Join("/srv/fleet", name+".toml"), fmt.Appendf(nil, `name = %q
memory = "256M"
[boot]
kernel = %q
[[disk]]
name = "data"
file = %q
format = "raw"
`, name, filepath.Join(images, "vmlinuz"), p))
		if err != nil {
			t.Fatal(err)
		}
		if _, err := s.Apply(ctx, f); err != nil {
			t.Fatal(err)
		}
		snap, err := s.Load(ctx, false)
		if err != nil {
			t.Fatal(err)
		}
		if ok, err := s.place(ctx, snap.VMs[name], "h1", nil); err != nil || !ok {
			t.Fatalf("place %s: %v %v", name, ok, err)
		}
	}
	a.reconcile(ctx) // its errors are the statuses' reasons
	snap, err := s.Load(ctx, false)
	if err != nil {
		t.Fatal(err)
	}
	for i, p := range paths {
		name := fmt.Sprintf("v%d", i)
		st := snap.Statuses[name].Value
		want := fmt.Sprintf("/srv/fleet/%s.toml:7:1: disk[0].file: %s", name, p)
		if st.State != StateInvalid || !strings.Contains(st.Reason, want) || !strings.Contains(st.Reason, "is outside the places VM files may name") {
			t.Errorf("%s (disk file %s): status %+v; want %s with %q ... is outside the places", name, p, st, StateInvalid, want)
		}
		if _, err := os.Stat(filepath.Join(root, "vms", name)); err == nil {
			t.Errorf("%s: its state directory was made: a start began", name)
		}
	}
}
