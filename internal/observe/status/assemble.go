package status

import (
	"context"
	"fmt"
	"os"
	"strings"

	"github.com/vmsup/vmsup/internal/host/ovmfvars"
	"github.com/vmsup/vmsup/internal/machine"
	vmnet "github.com/vmsup/vmsup/internal/net/nics"
	"github.com/vmsup/vmsup/internal/ops/plan"
	"github.com/vmsup/vmsup/internal/vm/vmstore"
	"github.com/vmsup/vmsup/qmp"
	"github.com/vmsup/vmsup/spec"
)

// recorded fills in what the VM's view (nil without a record) and its UEFI
// variable store say.
func recorded(out *Status, p vmstore.Paths, v *vmstore.View) {
	out.SecureBoot = secureBootStatus(p.UEFIVars)
	if v == nil {
		return
	}
	app := v.Applied
	out.Accel, out.AccelReason, out.SpecFile = app.Accel, app.AccelReason, v.Owner
	out.CPUModel, out.CPUMasks, out.UUID = app.CPUModel, app.CPUMasks, app.UUID
	out.VsockCID = app.VsockCID
	out.CPUs, out.Memory, out.Description = v.Booted.CPUs, v.Booted.Memory.String(), v.Booted.Description
	for _, d := range v.Disks {
		if d.Attached {
			out.AttachedDisks = append(out.AttachedDisks, d.Name)
		}
		if d.MovedFrom != "" {
			out.MovedDisks = append(out.MovedDisks, fmt.Sprintf("%s: %s -> %s", d.Name, d.MovedFrom, vmstore.DiskSource(d.Disk)))
		}
	}
	for _, h := range v.Booted.HostDevs {
		out.HostDevs = append(out.HostDevs, HostDevInfo{Address: h.Address, Name: h.Name})
	}
	for _, a := range app.AttachedHostDevs { // after the file's
		out.HostDevs = append(out.HostDevs, HostDevInfo{Address: a.Dev.Address, Name: a.Dev.Name, Attached: true})
	}
	for _, sn := range v.Tree.Snapshots {
		out.Snapshots = append(out.Snapshots, sn.Tag)
	}
	out.CurrentSnapshot = v.Tree.Current
}

// devices lists the VM's disks and NICs as its view v has them (moved, on
// snapshot overlays, hot-plugged), NICs with their host side; none without
// a view.
func (r *Reader) devices(ctx context.Context, name string, v *vmstore.View) ([]DiskInfo, []NICInfo) {
	if v == nil {
		return nil, nil
	}
	disks := []DiskInfo{}
	for _, d := range v.Disks {
		di := DiskInfo{Name: d.Name, Type: d.Type, Source: vmstore.DiskSource(d.Disk), Format: d.Format,
			ReadOnly: d.ReadOnly || d.IsCDROM(), Hotplugged: d.Attached, Image: d.Active.Path}
		if d.Limited() {
			di.IOLimits = plan.IOLimits(d.IOLimits)
		}
		disks = append(disks, di)
	}
	host := map[string]vmnet.NICStatus{}
	for _, h := range r.env.NICStatuses(ctx, name) {
		host[h.Name] = h
	}
	nics := []NICInfo{}
	for _, vn := range v.NICs {
		n := vn.NIC
		h, ok := host[n.Name]
		if !ok {
			h = vmnet.NICStatus{Name: n.Name, Type: n.Type, Hotplug: vn.Attached}
		}
		fw := n.Forwards
		if fw == nil {
			fw = []string{}
		}
		nics = append(nics, NICInfo{NICStatus: h, Link: n.LinkState(), MAC: n.MAC, Forwards: fw})
	}
	return disks, nics
}

// fileStatus fills what status says of the VM and its file: in sync or
// not, the record's generation, what an apply left pending.
func (r *Reader) fileStatus(out *Status, v *vmstore.View) {
	out.Sync, out.Generation = r.syncOf(v.Applied), v.Applied.Generation
	if pd := v.Pending; pd != nil && out.Sync != SyncInSync {
		out.Pending, out.PendingAtReboot = pd.Changes, pd.AtReboot
	}
}

// syncOf compares the running VM of app with its file as it is now.
func (r *Reader) syncOf(app *vmstore.Applied) string {
	if app.SourceFile == "" {
		return syncNotKnown
	}
	f, err := spec.Load(app.SourceFile)
	if err != nil {
		return SyncNoFile
	}
	if machine.RunsFile(app, &f.VM) {
		return SyncInSync
	}
	return SyncChanged
}

// QEMUState is QEMU's run state in vmsup's words, and why when that is
// not one vmsup expects of a live QEMU.
func QEMUState(qs qmp.StatusInfo) (State, string) {
	switch {
	case qs.Running:
		return StateRunning, ""
	case qs.Status == qmp.RunPrelaunch:
		// Paused by -S until its start plugs the disks and lets it run
		// (a start that died there is stopped by the next up).
		return StateStarting, ""
	case qs.Status == qmp.RunPaused || qs.Status == qmp.RunSuspended:
		return StatePaused, ""
	case qs.Status == qmp.RunGuestPanicked:
		return StatePanicked, "" // vmsup events NAME shows the GUEST_PANICKED
	case qs.Status == qmp.RunShutdown || qs.Status == qmp.RunInternalError || qs.Status == qmp.RunIOError:
		return StateUnknown, "QEMU status " + string(qs.Status)
	}
	return State(strings.ReplaceAll(string(qs.Status), "-", " ")), ""
}

// secureBootStatus reads the VM's variable store; nil without one (not a
// UEFI VM, or never started).
func secureBootStatus(vars string) *SecureBootStatus {
	if _, err := os.Stat(vars); err != nil {
		return nil
	}
	st, err := ovmfvars.Read(vars)
	if err != nil {
		return &SecureBootStatus{Err: err.Error()}
	}
	return &SecureBootStatus{Store: st, Warning: st.Warning()}
}
