package libvirtimport

import (
	"fmt"
	"strconv"

	"libvirt.org/go/libvirtxml"

	"github.com/vmsup/vmsup/spec"
)

type fileTPM struct {
	Model string `toml:"model,omitempty"`
}

type fileShare struct {
	Path     string `toml:"path"`
	Tag      string `toml:"tag"`
	ReadOnly bool   `toml:"read_only,omitempty"`
	Driver   string `toml:"driver,omitempty"`
}

type fileVsock struct {
	Enabled bool `toml:"enabled"`
	CID     int  `toml:"cid,omitempty"`
}

// guestDevs maps the TPM (an emulated TPM 2.0), shared folders (mount
// type, 9p or virtiofs) and vsock.
func (c *converter) guestDevs(dv *libvirtxml.DomainDeviceList) {
	for i, t := range dv.TPMs {
		el := fmt.Sprintf("devices/tpm[%d]", i)
		if t.Backend == nil || t.Backend.Emulator == nil || i > 0 {
			c.drop(el, "vmsup's TPM is one emulated TPM 2.0 (swtpm); no passthrough or external one")
			continue
		}
		if v := t.Backend.Emulator.Version; v != "" && v != "2.0" {
			c.drop(el+"/backend/@version", "%q: vmsup's TPM is a TPM 2.0", v)
			continue
		}
		tpm := &fileTPM{}
		switch t.Model {
		case "tpm-tis":
			tpm.Model = spec.TPMTIS
		case "", "tpm-crb":
		default:
			c.drop(el+"/@model", "%q: vmsup's TPM is tpm-crb or tpm-tis; crb it is", t.Model)
		}
		c.out.TPM = tpm
		c.drop(el, "the TPM starts anew (a new endorsement key); the guest's old TPM state (%s) is not carried over",
			"/var/lib/libvirt/swtpm/UUID")
	}
	for i, fs := range dv.Filesystems {
		el := fmt.Sprintf("devices/filesystem[%d]", i)
		if fs.Source == nil || fs.Source.Mount == nil || fs.Source.Mount.Dir == "" || fs.Target == nil {
			c.drop(el, "only host directories (type mount) are shared in vmsup")
			continue
		}
		if why := c.refused("source", "share.path", fs.Source.Mount.Dir); why != "" {
			c.drop(el, "%s", why)
			continue
		}
		sh := fileShare{Path: fs.Source.Mount.Dir, Tag: fs.Target.Dir, ReadOnly: fs.ReadOnly != nil}
		if fs.Driver != nil && fs.Driver.Type == "virtiofs" {
			sh.Driver = spec.ShareVirtioFS
		} else if fs.AccessMode != "" && fs.AccessMode != "passthrough" {
			c.drop(el+"/@accessmode", "%q: vmsup's 9p shares keep files as QEMU's user makes them (security_model none)", fs.AccessMode)
		}
		c.out.Shares = append(c.out.Shares, sh)
	}
	if v := dv.VSock; v != nil {
		out := &fileVsock{Enabled: true}
		if v.CID != nil && v.CID.Auto == "no" {
			if n, err := strconv.Atoi(v.CID.Address); err == nil {
				out.CID = n
			}
		}
		c.out.Vsock = out
	}
}
