package supervisor

import (
	"context"

	"github.com/vmsup/vmsup/internal/vmstate"
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
	// Image is the image QEMU writes for a file disk: a snapshot's
	// overlay on Source when the VM runs on one, else Source itself.
	Image string `json:"image,omitempty"`
}

// NICInfo is one of the VM's NICs: the spec's side (MAC, forwards) and,
// for tap NICs, the host side now (NICStatus).
type NICInfo struct {
	NICStatus
	// Link is "up" or "down": the link state the guest sees (the spec's
	// link, which QEMU is given with set_link).
	Link     string   `json:"link"`
	MAC      string   `json:"mac"`
	Forwards []string `json:"forwards"`
}

// diskSource says where a disk's data lives, in one string.
func diskSource(d spec.Disk) string { return vmstate.DiskSource(d) }

// devices lists the VM's disks and NICs as its view has them (vmstate.View:
// moved, on snapshot overlays, hot-plugged), NICs with their host side.
func (s *Supervisor) devices(ctx context.Context, name string) ([]DiskInfo, []NICInfo) {
	v, _ := s.view(name)
	if v == nil {
		return nil, nil
	}
	disks := []DiskInfo{}
	for _, d := range v.Disks {
		disks = append(disks, DiskInfo{Name: d.Name, Type: d.Type, Source: diskSource(d.Disk), Format: d.Format,
			ReadOnly: d.ReadOnly || d.IsCDROM(), Hotplugged: d.Attached, Image: d.Active.Path})
	}
	host := map[string]NICStatus{}
	for _, h := range s.nicStatuses(ctx, name) {
		host[h.Name] = h
	}
	nics := []NICInfo{}
	for _, vn := range v.NICs {
		n := vn.NIC
		h, ok := host[n.Name]
		if !ok {
			h = NICStatus{Name: n.Name, Type: n.Type, Hotplug: vn.Attached}
		}
		fw := n.Forwards
		if fw == nil {
			fw = []string{}
		}
		nics = append(nics, NICInfo{NICStatus: h, Link: n.LinkState(), MAC: n.MAC, Forwards: fw})
	}
	return disks, nics
}
