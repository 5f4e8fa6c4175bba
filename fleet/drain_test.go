package fleet

import (
	"context"
	"io"
	"log/slog"
	"slices"
	"strings"
	"testing"

	"github.com/vmsup/vmsup/spec"
	"github.com/vmsup/vmsup/supervisor"
)

// drainSup is a host's supervisor as a drain's source sees it: each VM's
// state, and the removals and migrations asked of it. Any other call
// panics (the embedded interface is nil): the drain must not make it.
type drainSup struct {
	Supervisor
	state             map[string]supervisor.State
	removed, migrated []string
}

func (s *drainSup) Status(_ context.Context, name string) (supervisor.Status, error) {
	return supervisor.Status{State: s.state[name]}, nil
}

func (s *drainSup) RemoveVM(_ context.Context, name string) ([]string, error) {
	s.removed = append(s.removed, name)
	return nil, nil
}

func (s *drainSup) Migrate(_ context.Context, name string, _ supervisor.MigrateOptions) (supervisor.MigrateResult, error) {
	s.migrated = append(s.migrated, name)
	return supervisor.MigrateResult{}, nil
}

// TestDrainLocalDisks: what a drain's source does with each VM. Shut off
// on a local file disk (cold): kept here, not removed, its status says
// why, until the host is uncordoned (then the target is dropped). Shut off
// with no writable disk (bare): removed here and handed to the target, as
// before. Running on an overlay of a stored image its target's record does
// not list (img): not migrated yet, its status says so; migrated once the
// target lists the image.
func TestDrainLocalDisks(t *testing.T) {
	s := newStore(t)
	ctx := t.Context()
	const digest = "sha256:aa"
	putHost(t, s, Host{Name: "h1", CPUs: 4, Memory: 1 << 30})
	files := []*spec.File{
		vmFile(t, "cold", "128M", "[[disk]]\nname = \"data\"\nfile = \"/nonexistent/cold.qcow2\"\nformat = \"qcow2\"\nsize = \"64M\"\n"),
		vmFile(t, "bare", "128M", ""),
		vmFile(t, "img", "128M", "[[disk]]\nname = \"root\"\nfile = \"/nonexistent/img.qcow2\"\nimage = \"tiny\"\n"),
	}
	refs := func(f *spec.File) ([]ImageRef, error) {
		if f.VM.Name != "img" {
			return nil, nil
		}
		return []ImageRef{{Disk: "root", Ref: "tiny", Digest: digest, Source: "http://nowhere/tiny.qcow2"}}, nil
	}
	if _, err := s.ApplyImages(ctx, refs, files...); err != nil {
		t.Fatal(err)
	}
	log := slog.New(slog.NewTextHandler(io.Discard, nil))
	sch := &Scheduler{Store: s, Log: log}
	pass := func() *Snapshot {
		t.Helper()
		if err := sch.Pass(ctx); err != nil {
			t.Fatal(err)
		}
		snap, err := s.Load(ctx, false)
		if err != nil {
			t.Fatal(err)
		}
		return snap
	}
	pass() // all on h1
	putHost(t, s, Host{Name: "h2", CPUs: 4, Memory: 1 << 30})
	if err := s.Cordon(ctx, "h1", true); err != nil {
		t.Fatal(err)
	}
	pass() // targets: h2
	sup := &drainSup{state: map[string]supervisor.State{"cold": supervisor.StateShutOff, "bare": supervisor.StateShutOff, "img": supervisor.StateRunning}}
	a := &Agent{Store: s, Sup: sup, Host: Host{Name: "h1"}, State: t.TempDir(), Log: log}
	a.init()
	reconcile := func() *Snapshot {
		t.Helper()
		if err := a.reconcile(ctx); err != nil {
			t.Fatal(err)
		}
		return pass()
	}
	snap := reconcile()
	cold, bare, img := snap.Placements["cold"].Value, snap.Placements["bare"].Value, snap.Placements["img"].Value
	if cold.Host != "h1" || cold.Target != "h2" || !strings.Contains(snap.Statuses["cold"].Value.Reason,
		"drain: cold is shut off on local disks (disk data is a file on h1); only a running VM's migration copies them, so it stays: fleet uncordon h1") {
		t.Errorf("cold: %+v, status %+v; want kept on h1, saying why", cold, snap.Statuses["cold"].Value)
	}
	if bare.Host != "h2" || !slices.Equal(sup.removed, []string{"bare"}) {
		t.Errorf("bare: %+v, removed here %v; want it handed to h2 and removed here (only it)", bare, sup.removed)
	}
	if img.Host != "h1" || len(sup.migrated) != 0 || snap.Statuses["img"].Value.Reason != "drain: to h2 once its store holds image "+digest+" (it pulls it)" {
		t.Errorf("img: %+v, migrated %v, status %+v; want it waiting for h2's pull", img, sup.migrated, snap.Statuses["img"].Value)
	}
	putHost(t, s, Host{Name: "h2", CPUs: 4, Memory: 1 << 30, Images: []string{digest}})
	if snap = reconcile(); snap.Placements["img"].Value.Host != "h2" || !slices.Equal(sup.migrated, []string{"img"}) {
		t.Errorf("img once h2 holds its image: %+v, migrated %v; want migrated to h2", snap.Placements["img"].Value, sup.migrated)
	}
	if err := s.Cordon(ctx, "h1", false); err != nil {
		t.Fatal(err)
	}
	if snap = reconcile(); snap.Placements["cold"].Value.Host != "h1" || snap.Placements["cold"].Value.Target != "" {
		t.Errorf("cold once h1 is uncordoned: %+v; want it on h1, no target (its agent starts it again)", snap.Placements["cold"].Value)
	}
}
