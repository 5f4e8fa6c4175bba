package libvirtimport

import (
	"fmt"
	"strconv"
	"strings"

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
	el       string // the domain element it came from (repair's lines)
}

type fileVsock struct {
	Enabled bool `toml:"enabled"`
	CID     int  `toml:"cid,omitempty"`
}

// share maps one filesystem to a share. A target that is not a vmsup tag
// (libvirt takes any string, "/import/from/host" too) becomes one, with
// a line: the guest mounts it by the new tag.
func (c *converter) share(el string, fs *libvirtxml.DomainFilesystem, tags map[string]bool) {
	switch {
	case fs.Source == nil || fs.Source.Mount == nil || fs.Source.Mount.Dir == "" || fs.Target == nil:
		c.drop(el, "only host directories (type mount) are shared in vmsup")
		return
	case len(c.out.Shares) >= spec.MaxShares:
		c.drop(el, "vmsup shares at most %d folders a VM", spec.MaxShares)
		return
	}
	if why := c.refused("source", "share.path", fs.Source.Mount.Dir); why != "" {
		c.drop(el, "%s", why)
		return
	}
	sh := fileShare{Path: fs.Source.Mount.Dir, Tag: shareTag(fs.Target.Dir, len(c.out.Shares), tags), ReadOnly: fs.ReadOnly != nil, el: el}
	if sh.Tag != fs.Target.Dir {
		c.note(el+"/target", "tag %q is %q here (vmsup tags are at most %d letters, digits, '_', '.', '-'): mount it by the new tag", fs.Target.Dir, sh.Tag, spec.MaxShareTag)
	}
	tags[sh.Tag] = true
	if fs.Driver != nil && fs.Driver.Type == "virtiofs" {
		sh.Driver = spec.ShareVirtioFS
		if fs.Binary != nil {
			c.drop(el+"/binary", "virtiofsd's options: vmsup runs its own virtiofsd with its own (its sandbox, no xattr, the default cache)")
		}
		if fs.Driver.Queue != 0 && fs.Driver.Queue != spec.VirtioFSQueueSize {
			c.drop(el+"/driver/@queue", "%d: vmsup's virtiofs queue holds %d requests", fs.Driver.Queue, spec.VirtioFSQueueSize)
		}
	} else {
		c.ninep(el, fs)
	}
	c.out.Shares = append(c.out.Shares, sh)
}

// ninep lists how a 9p share differs: libvirt's access mode (passthrough
// when absent: files with the guest's owners, QEMU as root) and its
// driver (path; handle is gone from QEMU 7.2) are vmsup's
// security_model=none on the local driver.
func (c *converter) ninep(el string, fs *libvirtxml.DomainFilesystem) {
	mode := cmpOr(fs.AccessMode, "passthrough")
	if mode != "squash" {
		c.drop(el+"/@accessmode", "%q: vmsup's 9p shares keep files as QEMU's user makes them (security_model=none, owners not kept)", mode)
	}
	if d := fs.Driver; d != nil && d.Type != "" && d.Type != "path" {
		c.drop(el+"/driver/@type", "%q: vmsup's 9p shares use QEMU's local driver (libvirt's path)", d.Type)
	}
}

// shareTag makes target a vmsup tag, unique among taken.
func shareTag(target string, i int, taken map[string]bool) string {
	tag := strings.Trim(badNameChar.ReplaceAllString(target, "_"), "_.-")
	if len(tag) > spec.MaxShareTag {
		tag = tag[len(tag)-spec.MaxShareTag:] // the end names the folder
		tag = strings.TrimLeft(tag, "_.-")
	}
	if tag == "" || taken[tag] {
		tag = fmt.Sprintf("share%d", i)
	}
	return tag
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
		if t.Backend.Emulator.ActivePCRBanks != nil {
			c.drop(el+"/backend/active_pcr_banks", "swtpm_setup's default PCR banks apply (sha256)")
		}
		c.note(el, "the TPM starts anew (a new endorsement key); the guest's old TPM state (%s) is not carried over",
			"/var/lib/libvirt/swtpm/UUID")
	}
	tags := map[string]bool{}
	for i := range dv.Filesystems {
		c.share(fmt.Sprintf("devices/filesystem[%d]", i), &dv.Filesystems[i], tags)
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
