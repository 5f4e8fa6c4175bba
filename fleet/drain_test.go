package fleet

import (
	"context"
	"errors"
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
	state                    map[string]supervisor.State
	removed, migrated, moved []string
	moveErr                  map[string]error
}

func (s *drainSup) Status(_ context.Context, name string) (supervisor.Status, error) {
	return supervisor.Status{State: s.state[name]}, nil
}

func (s *drainSup) RemoveVM(_ context.Context, name string) ([]string, error) {
	s.removed = append(s.removed, name)
	return nil, nil
}

func (s *drainSup) Move(_ context.Context, name string, _ supervisor.MigrateOptions) (supervisor.MigrateResult, error) {
	if err := s.moveErr[name]; err != nil {
		return supervisor.MigrateResult{}, err
	}
	s.moved = append(s.moved, name)
	return supervisor.MigrateResult{}, nil
}

func (s *drainSup) Migrate(_ context.Context, name string, _ supervisor.MigrateOptions) (supervisor.MigrateResult, error) {
	s.migrated = append(s.migrated, name)
	return supervisor.MigrateResult{}, nil
}

// TestDrainLocalDisks: what a drain's source does with each VM. Shut off
// on a local file disk (cold): moved with its disks (vmsup move) and
// handed to the target, never removed here to start on empty disks there;
// one whose move fails (stuck) stays here, its status saying why. Shut off
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
		vmFile(t, "stuck", "128M", "[[disk]]\nname = \"data\"\nfile = \"/nonexistent/stuck.qcow2\"\nformat = \"qcow2\"\nsize = \"64M\"\n"),
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
	sup := &drainSup{state: map[string]supervisor.State{"cold": supervisor.StateShutOff, "bare": supervisor.StateShutOff,
		"stuck": supervisor.StateShutOff, "img": supervisor.StateRunning},
		moveErr: map[string]error{"stuck": errors.New(`vm "stuck": has snapshots`)}}
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
	if cold.Host != "h2" || !slices.Equal(sup.moved, []string{"cold"}) || snap.Statuses["cold"].Value.Reason != "moved shut off by a drain, its disks copied" {
		t.Errorf("cold: %+v, moved %v, status %+v; want moved with its disks and handed to h2", cold, sup.moved, snap.Statuses["cold"].Value)
	}
	if stuck := snap.Placements["stuck"].Value; stuck.Host != "h1" || stuck.Target != "h2" ||
		!strings.Contains(snap.Statuses["stuck"].Value.Reason, `drain: migration to h2 failed (next try in`) ||
		!strings.Contains(snap.Statuses["stuck"].Value.Reason, "has snapshots") {
		t.Errorf("stuck: %+v, status %+v; want kept on h1, saying why", stuck, snap.Statuses["stuck"].Value)
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
}
