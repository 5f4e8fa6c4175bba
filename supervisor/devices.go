package supervisor

import (
	"context"
	"fmt"

	"github.com/vmsup/vmsup/spec"
)

// DiskInfo is one of the VM's disks, as status and disk ls show it.
type DiskInfo struct {
	Name       string `json:"name"`
	Type       string `json:"type"`
	Source     string `json:"source"` // the image or device path, iscsi://PORTAL/TARGET/LUN or rbd:POOL/IMAGE
	Format     string `json:"format"`
	ReadOnly   bool   `json:"read_only"`
	Hotplugged bool   `json:"hotplugged"` // added with vmsup disk attach
}

// NICInfo is one of the VM's NICs: the spec's side (MAC, forwards) and,
// for tap NICs, the host side now (NICStatus).
type NICInfo struct {
	NICStatus
	MAC      string   `json:"mac"`
	Forwards []string `json:"forwards"`
}

// diskSource says where a disk's data lives, in one string.
func diskSource(d spec.Disk) string {
	switch d.Type {
	case spec.DiskISCSI:
		return fmt.Sprintf("iscsi://%s/%s/%d", d.Portal, d.Target, d.LUN)
	case spec.DiskRBD:
		return "rbd:" + d.Pool + "/" + d.Image
	case spec.DiskSeed:
		return "cloud-init seed (built by vmsup)"
	}
	return d.File
}

// devices lists the VM's disks and NICs from the spec it runs (or last ran)
// with and what was hot-plugged since, NICs with their host side.
func (s *Supervisor) devices(ctx context.Context, name string) ([]DiskInfo, []NICInfo) {
	app, vm, _ := s.runningSpec(name)
	if vm == nil {
		return nil, nil
	}
	disks := []DiskInfo{}
	for _, d := range withMoved(vm.Disks, app.Moved) {
		disks = append(disks, DiskInfo{Name: d.Name, Type: d.Type, Source: diskSource(d), Format: d.Format, ReadOnly: d.ReadOnly || d.IsCDROM()})
	}
	for _, a := range app.Attached {
		d := a.Disk
		disks = append(disks, DiskInfo{Name: d.Name, Type: d.Type, Source: diskSource(d), Format: d.Format, ReadOnly: d.ReadOnly || d.IsCDROM(), Hotplugged: true})
	}
	host := map[string]NICStatus{}
	for _, h := range s.nicStatuses(ctx, name) {
		host[h.Name] = h
	}
	nics := []NICInfo{}
	for i, n := range append(append([]spec.NIC{}, vm.NICs...), app.AttachedNICs...) {
		h, ok := host[n.Name]
		if !ok {
			h = NICStatus{Name: n.Name, Type: n.Type, Hotplug: i >= len(vm.NICs)}
		}
		fw := n.Forwards
		if fw == nil {
			fw = []string{}
		}
		nics = append(nics, NICInfo{NICStatus: h, MAC: n.MAC, Forwards: fw})
	}
	return disks, nics
}
