package snapshottest

import (
	"context"
	"encoding/json"
	"fmt"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"
	"time"

	devices "github.com/vmsup/vmsup/internal/lifecycle/qdev"
	"github.com/vmsup/vmsup/spec"
	"github.com/vmsup/vmsup/supervisor"
	"github.com/vmsup/vmsup/supervisor/supervisortest"
)

// TestOneView takes one VM through a snapshot taken and removed across a
// restart (so the disk ends on an image QEMU opened from an overlay's
// header), a disk move, a disk and a NIC hot-plugged, an apply that adds a
// disk, and a second snapshot; after the move and again after the snapshot,
// status, plan, a backup and an NBD export name exactly the images and
// devices QEMU's query-block and query-pci name.
func TestOneView(t *testing.T) {
	ctx := supervisortest.Context(t, 8*time.Minute)
	dir := t.TempDir()
	sup := supervisortest.New(t, env, "", vmsupBin)
	images := filepath.Join(sup.Root(), "images")
	if err := os.MkdirAll(images, 0o711); err != nil {
		t.Fatal(err)
	}
	file := func(extra string) *spec.File {
		return supervisortest.LoadTOML(t, dir, "oneview", fmt.Sprintf(`name = "oneview"
memory = "256M"
accel = "tcg"
hotplug_slots = 4
stop_timeout = "20s"
[boot]
kernel = %q
initrd = %q
cmdline = "console=ttyS0 no_timer_check"
[[disk]]
name = "data"
file = %q
size = "16M"
[[nic]]
name = "net0"
%s`, env.Guest.Kernel, env.Guest.Initrd, filepath.Join(dir, "data.qcow2"), extra))
	}
	f := file("")
	if _, err := sup.Up(ctx, f); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { sup.Kill(context.Background(), "oneview") })

	// A snapshot, a restart onto its overlay, its removal: the disk now
	// runs on the base image QEMU opened from the overlay's header.
	if _, err := sup.Snapshot(ctx, "oneview", "s1", supervisor.SnapshotOptions{}); err != nil {
		t.Fatal(err)
	}
	if _, err := sup.Down(ctx, "oneview"); err != nil {
		t.Fatal(err)
	}
	if _, err := sup.Up(ctx, f); err != nil {
		t.Fatal(err)
	}
	if err := sup.RemoveSnapshot(ctx, "oneview", "s1", nil); err != nil {
		t.Fatal(err)
	}
	moved := filepath.Join(images, "data-moved.qcow2")
	if _, err := sup.MoveDisk(ctx, "oneview", "data", supervisor.MoveOptions{To: moved}); err != nil {
		t.Fatalf("disk move after a snapshot's removal: %v", err)
	}
	hot, err := spec.CheckDisk("--file", spec.Disk{Name: "hot", File: filepath.Join(images, "hot.qcow2"), Size: 8 * spec.MiB}, "oneview")
	if err != nil {
		t.Fatal(err)
	}
	if _, err := sup.AttachDisk(ctx, "oneview", *hot); err != nil {
		t.Fatal(err)
	}
	if _, err := sup.AttachNIC(ctx, "oneview", spec.NIC{Name: "hot0", Type: spec.NICUser}); err != nil {
		t.Fatal(err)
	}
	f = file(fmt.Sprintf("[[disk]]\nname = \"extra\"\nfile = %q\nsize = \"8M\"\n", filepath.Join(images, "extra.qcow2")))
	if _, err := sup.Apply(ctx, f, supervisor.ApplyOptions{}); err != nil {
		t.Fatal(err)
	}
	st := viewsAgree(t, ctx, sup, f)
	if d := diskNamed(st, "data"); d.Source != moved || d.Image != moved {
		t.Errorf("status after the move: data %+v, want it on %s", d, moved)
	}

	if _, err := sup.Snapshot(ctx, "oneview", "s2", supervisor.SnapshotOptions{}); err != nil {
		t.Fatal(err)
	}
	st = viewsAgree(t, ctx, sup, f)
	if d := diskNamed(st, "data"); d.Source != moved || d.Image == moved {
		t.Errorf("status after the snapshot: data %+v, want an overlay on %s", d, moved)
	}
}

func diskNamed(st supervisor.Status, name string) supervisor.DiskInfo {
	i := slices.IndexFunc(st.Disks, func(d supervisor.DiskInfo) bool { return d.Name == name })
	if i < 0 {
		return supervisor.DiskInfo{}
	}
	return st.Disks[i]
}

// viewsAgree checks that status, plan, a full backup and an NBD export of
// f's VM name the images and devices QEMU does, and returns the status.
func viewsAgree(t *testing.T, ctx context.Context, sup *supervisor.Supervisor, f *spec.File) supervisor.Status {
	t.Helper()
	name := f.VM.Name
	st, err := sup.Status(ctx, name)
	if err != nil {
		t.Fatal(err)
	}
	qemuImages := queryBlockImages(t, ctx, sup, name)
	statusImages := map[string]string{}
	for _, d := range st.Disks {
		statusImages[d.Name] = d.Image
	}
	if !mapsEqual(statusImages, qemuImages) {
		t.Errorf("status names images %v, QEMU's query-block %v", statusImages, qemuImages)
	}
	var want []string
	for _, d := range st.Disks {
		want = append(want, "disk-"+d.Name)
	}
	for _, n := range st.NICs {
		want = append(want, "nic-"+n.Name)
	}
	if got := queryPCIDevices(t, ctx, sup, name); !sameSet(got, want) {
		t.Errorf("status has devices %v, QEMU's query-pci %v", want, got)
	}
	if p, err := sup.Plan(ctx, f); err != nil || !p.InSync {
		t.Errorf("plan of the VM's file: %+v %v", p, err)
	}
	res, err := sup.Backup(ctx, name, supervisor.BackupOptions{Dir: t.TempDir()})
	if err != nil {
		t.Fatal(err)
	}
	backed := map[string]string{}
	for _, d := range res.Disks {
		backed[d.Disk] = d.Image
	}
	if !mapsEqual(backed, qemuImages) {
		t.Errorf("the backup copied %v, QEMU runs on %v", backed, qemuImages)
	}
	exported := nbdImages(t, ctx, sup, name)
	if !mapsEqual(exported, qemuImages) {
		t.Errorf("the NBD export served %v, QEMU runs on %v", exported, qemuImages)
	}
	return st
}

// queryBlockImages maps each disk (device disk-NAME) to the image QEMU has
// on top of it.
func queryBlockImages(t *testing.T, ctx context.Context, sup *supervisor.Supervisor, name string) map[string]string {
	t.Helper()
	out, err := sup.QMP(ctx, name, []byte(`{"execute":"query-block"}`), false)
	if err != nil {
		t.Fatal(err)
	}
	var r struct {
		Return []struct {
			QDev     string `json:"qdev"`
			Inserted *struct {
				Image struct {
					Filename string `json:"filename"`
				} `json:"image"`
			} `json:"inserted"`
		} `json:"return"`
	}
	if err := json.Unmarshal(out, &r); err != nil {
		t.Fatal(err)
	}
	sets := fdSetFiles(t, ctx, sup, name)
	images := map[string]string{}
	for _, b := range r.Return {
		_, rest, ok := strings.Cut(b.QDev, "disk-")
		if !ok || b.Inserted == nil {
			continue
		}
		disk, _, _ := strings.Cut(rest, "/")
		images[disk] = imageFile(b.Inserted.Image.Filename, sets)
	}
	return images
}

// fdSetFiles maps /dev/fdset/N to the file its descriptor's note names
// (QEMU's own query-fdsets, for images vmsup handed over).
func fdSetFiles(t *testing.T, ctx context.Context, sup *supervisor.Supervisor, name string) map[string]string {
	t.Helper()
	out, err := sup.QMP(ctx, name, []byte(`{"execute":"query-fdsets"}`), false)
	if err != nil {
		t.Fatal(err)
	}
	var r struct {
		Return []struct {
			ID  int `json:"fdset-id"`
			FDs []struct {
				Opaque string `json:"opaque"`
			} `json:"fds"`
		} `json:"return"`
	}
	if err := json.Unmarshal(out, &r); err != nil {
		t.Fatal(err)
	}
	files := map[string]string{}
	for _, s := range r.Return {
		for _, f := range s.FDs {
			if p, ok := devices.FDSetFile(f.Opaque); ok {
				files[fmt.Sprintf("/dev/fdset/%d", s.ID)] = p
			}
		}
	}
	return files
}

// imageFile is the file an image's filename in query-block names: a
// json: name (an overlay whose backing is a descriptor) by its own file,
// a descriptor by its set's file.
func imageFile(name string, sets map[string]string) string {
	if j, ok := strings.CutPrefix(name, "json:"); ok {
		var o struct {
			File struct {
				Filename string `json:"filename"`
			} `json:"file"`
		}
		if json.Unmarshal([]byte(j), &o) == nil && o.File.Filename != "" {
			name = o.File.Filename
		}
	}
	if p, ok := sets[name]; ok {
		return p
	}
	return name
}

// queryPCIDevices lists the qdev ids of QEMU's disk and NIC devices, on
// every bus (behind root ports too).
func queryPCIDevices(t *testing.T, ctx context.Context, sup *supervisor.Supervisor, name string) []string {
	t.Helper()
	out, err := sup.QMP(ctx, name, []byte(`{"execute":"query-pci"}`), false)
	if err != nil {
		t.Fatal(err)
	}
	var r struct {
		Return []pciBus `json:"return"`
	}
	if err := json.Unmarshal(out, &r); err != nil {
		t.Fatal(err)
	}
	var ids []string
	var walk func(devs []pciDev)
	walk = func(devs []pciDev) {
		for _, d := range devs {
			if strings.HasPrefix(d.QDevID, "disk-") || strings.HasPrefix(d.QDevID, "nic-") {
				ids = append(ids, d.QDevID)
			}
			if d.Bridge != nil {
				walk(d.Bridge.Devices)
			}
		}
	}
	for _, b := range r.Return {
		walk(b.Devices)
	}
	return ids
}

type pciBus struct {
	Devices []pciDev `json:"devices"`
}

type pciDev struct {
	QDevID string `json:"qdev_id"`
	Bridge *struct {
		Devices []pciDev `json:"devices"`
	} `json:"pci_bridge"`
}

// nbdImages runs an NBD export until it serves and maps each exported disk
// to the image it serves from.
func nbdImages(t *testing.T, ctx context.Context, sup *supervisor.Supervisor, name string) map[string]string {
	t.Helper()
	ectx, cancel := context.WithCancel(ctx)
	defer cancel()
	images := map[string]string{}
	done := make(chan error, 1)
	go func() {
		done <- sup.ExportNBD(ectx, name, supervisor.ExportOptions{Socket: filepath.Join(t.TempDir(), "nbd.sock"),
			Ready: func(info supervisor.ExportInfo) {
				for _, e := range info.Exports {
					images[e.Disk] = e.Image
				}
				cancel()
			}})
	}()
	if err := <-done; err != nil {
		t.Fatalf("nbd export: %v", err)
	}
	return images
}

func mapsEqual(a, b map[string]string) bool {
	if len(a) != len(b) {
		return false
	}
	for k, v := range a {
		if w, ok := b[k]; !ok || w != v {
			return false
		}
	}
	return true
}

func sameSet(a, b []string) bool {
	a, b = slices.Clone(a), slices.Clone(b)
	slices.Sort(a)
	slices.Sort(b)
	return slices.Equal(a, b)
}
