package spec

import (
	"bytes"
	"fmt"
	"net"
	"reflect"
	"strconv"
	"strings"

	toml "github.com/pelletier/go-toml/v2"
)

// Disk types (the disk's "type" key).
const (
	DiskFile  = "file"  // an image file (qcow2 or raw), created on demand with size/backing
	DiskBlock = "block" // a host block device (LVM volume, loop device): QEMU's host_device
	DiskISO   = "iso"   // a read-only CD-ROM image
	DiskSeed  = "seed"  // a cloud-init NoCloud seed CD-ROM vmsup builds from user_data etc.
	DiskISCSI = "iscsi" // an iSCSI LUN through QEMU's libiscsi driver
	DiskRBD   = "rbd"   // a Ceph RBD image through QEMU's rbd driver
)

// DefaultISCSIPort is added to an iSCSI portal without a port.
const DefaultISCSIPort = "3260"

// NeedsSecret reports whether the disk has a secret (CHAP password, cephx
// key) that QEMU must get through a secret object.
func (d *Disk) NeedsSecret() bool {
	return (d.Type == DiskISCSI || d.Type == DiskRBD) && d.SecretFile != ""
}

func (d *Disk) applyDefaults(vmName string) {
	if d.Type == "" {
		d.Type = DiskFile
	}
	if d.Format == "" {
		d.Format = FormatRaw
		if d.Type == DiskFile && (hasSuffixFold(d.File, ".qcow2") || d.Backing != "" || d.Image != "") {
			d.Format = FormatQcow2
		}
	}
	if d.Cache == "" {
		d.Cache = "writeback"
	}
	if d.AIO == "" {
		d.AIO = "threads"
	}
	d.applyBusDefaults()
	if d.IsCDROM() {
		d.ReadOnly = true
	}
	if d.Type == DiskSeed && d.MetaData == "" && d.MetaDataFile == "" {
		d.MetaData = fmt.Sprintf("instance-id: %s\nlocal-hostname: %s\n", vmName, vmName)
	}
	if d.Type == DiskISCSI && d.Portal != "" {
		if _, _, err := net.SplitHostPort(d.Portal); err != nil && !strings.Contains(d.Portal, "]") && strings.Count(d.Portal, ":") == 0 {
			d.Portal = net.JoinHostPort(d.Portal, DefaultISCSIPort)
		}
	}
}

// validateDisk checks one disk; prefix is "disk[N]." in a VM file and ""
// in a disk file (ParseDisk).
// diskFail reports a problem with one key of the disk being validated.
type diskFail func(key, format string, args ...any) error

// validateDisk checks one disk, step by step: its name, its text fields,
// the keys its type takes, what its type needs, its format, its I/O.
func (f *File) validateDisk(prefix string, d *Disk) error {
	fail := func(key, format string, args ...any) error {
		return f.Errorf(prefix+key, format, args...)
	}
	if err := ValidName(d.Name); err != nil {
		return fail("name", "%v", err)
	}
	for _, step := range []func(*Disk, diskFail) error{diskText, diskKeys, diskType, diskFormat, diskBus, diskNet, diskIO, diskTuning} {
		if err := step(d, fail); err != nil {
			return err
		}
	}
	return nil
}

// diskText: no newline or NUL in what becomes a path or a QEMU option.
func diskText(d *Disk, fail diskFail) error {
	for _, p := range []struct{ key, v string }{{"file", d.File}, {"backing", d.Backing}, {"ceph_conf", d.CephConf},
		{"secret_file", d.SecretFile}, {"user_data_file", d.UserDataFile}, {"meta_data_file", d.MetaDataFile},
		{"network_config_file", d.NetworkConfigFile}, {"portal", d.Portal}, {"target", d.Target},
		{"pool", d.Pool}, {"image", d.Image}, {"user", d.User},
		{"snapshot", d.Snapshot}, {"namespace", d.Namespace}, {"initiator_name", d.InitiatorName}} {
		if strings.ContainsAny(p.v, "\n\r\x00") {
			return fail(p.key, "path contains a newline or NUL")
		}
	}
	return nil
}

// diskKeys: keys that belong to other types are mistakes, not silently ignored.
func diskKeys(d *Disk, fail diskFail) error {
	only := func(key string, set bool, types ...string) error {
		if !set {
			return nil
		}
		for _, t := range types {
			if d.Type == t {
				return nil
			}
		}
		return fail(key, "applies only to disk type %s, not %q", strings.Join(types, "/"), d.Type)
	}
	for _, c := range []struct {
		key   string
		set   bool
		types []string
	}{
		{"file", d.File != "", []string{DiskFile, DiskBlock, DiskISO}},
		{"size", d.Size != 0, []string{DiskFile}},
		{"backing", d.Backing != "", []string{DiskFile}},
		{"portal", d.Portal != "", []string{DiskISCSI}},
		{"target", d.Target != "", []string{DiskISCSI}},
		{"lun", d.LUN != 0, []string{DiskISCSI}},
		{"pool", d.Pool != "", []string{DiskRBD}},
		{"image", d.Image != "", []string{DiskRBD, DiskFile}},
		{"monitors", len(d.Monitors) > 0, []string{DiskRBD}},
		{"ceph_conf", d.CephConf != "", []string{DiskRBD}},
		{"user", d.User != "", []string{DiskISCSI, DiskRBD}},
		{"secret_file", d.SecretFile != "", []string{DiskISCSI, DiskRBD}},
		{"user_data", d.UserData != "", []string{DiskSeed}},
		{"network_config", d.NetworkConfig != "", []string{DiskSeed}},
		{"user_data_file", d.UserDataFile != "", []string{DiskSeed}},
		{"meta_data_file", d.MetaDataFile != "", []string{DiskSeed}},
		{"network_config_file", d.NetworkConfigFile != "", []string{DiskSeed}},
		{"iothread", d.IOThread, []string{DiskFile, DiskBlock, DiskISCSI, DiskRBD}},
		{"iothread_id", d.IOThreadID != 0, []string{DiskFile, DiskBlock, DiskISCSI, DiskRBD}},
		{"iothread_map", len(d.IOThreadMap) > 0, []string{DiskFile, DiskBlock, DiskISCSI, DiskRBD}},
		{"initiator_name", d.InitiatorName != "", []string{DiskISCSI}},
		{"header_digest", d.HeaderDigest != "", []string{DiskISCSI}},
		{"transport", d.Transport != "", []string{DiskISCSI}},
		{"snapshot", d.Snapshot != "", []string{DiskRBD}},
		{"namespace", d.Namespace != "", []string{DiskRBD}},
		{"auth_client_required", len(d.AuthClientRequired) > 0, []string{DiskRBD}},
	} {
		if err := only(c.key, c.set, c.types...); err != nil {
			return err
		}
	}
	return nil
}

// diskType: what each type needs.
func diskType(d *Disk, fail diskFail) error {
	switch d.Type {
	case DiskFile, DiskBlock, DiskISO:
		if d.File == "" {
			return fail("file", "missing image path")
		}
		if d.Type == DiskFile && d.Image != "" {
			return diskOnImage(d, fail)
		}
	case DiskSeed:
		if d.MetaData != "" && d.MetaDataFile != "" {
			return fail("meta_data_file", "give meta_data or meta_data_file, not both")
		}
		if d.UserData != "" && d.UserDataFile != "" {
			return fail("user_data_file", "give user_data or user_data_file, not both")
		}
		if d.NetworkConfig != "" && d.NetworkConfigFile != "" {
			return fail("network_config_file", "give network_config or network_config_file, not both")
		}
	case DiskISCSI:
		if d.Portal == "" {
			return fail("portal", "missing (e.g. portal = \"192.0.2.10:3260\")")
		}
		if _, port, err := net.SplitHostPort(d.Portal); err != nil {
			return fail("portal", "%q is not HOST:PORT: %v", d.Portal, err)
		} else if n, err := strconv.Atoi(port); err != nil || n < 1 || n > 65535 {
			return fail("portal", "%q: bad port", d.Portal)
		}
		if !strings.HasPrefix(d.Target, "iqn.") && !strings.HasPrefix(d.Target, "eui.") && !strings.HasPrefix(d.Target, "naa.") {
			return fail("target", "%q is not an iSCSI name (iqn.YYYY-MM.domain:name)", d.Target)
		}
		if d.LUN < 0 || d.LUN > 16383 {
			return fail("lun", "%d is out of range 0..16383", d.LUN)
		}
		if (d.User == "") != (d.SecretFile == "") {
			return fail("secret_file", "CHAP needs both user and secret_file")
		}
	case DiskRBD:
		if d.Pool == "" || strings.ContainsAny(d.Pool, "/@") {
			return fail("pool", "missing or invalid pool name %q", d.Pool)
		}
		if d.Image == "" || strings.ContainsAny(d.Image, "/@") {
			return fail("image", "missing or invalid image name %q", d.Image)
		}
		for i, m := range d.Monitors {
			host, port, err := net.SplitHostPort(m)
			if err != nil || host == "" {
				return fail(fmt.Sprintf("monitors[%d]", i), "%q is not HOST:PORT", m)
			}
			// librados reads a bad port as another monitor address, and
			// the open fails late, inside QEMU: refuse it here.
			if n, err := strconv.Atoi(port); err != nil || n < 1 || n > 65535 {
				return fail(fmt.Sprintf("monitors[%d]", i), "%q: bad port %q (1..65535)", m, port)
			}
		}
		if d.SecretFile != "" && d.User == "" {
			return fail("user", "a cephx key (secret_file) needs the user it belongs to")
		}
	default:
		return fail("type", "unknown disk type %q (want \"file\", \"block\", \"iso\", \"seed\", \"iscsi\" or \"rbd\")", d.Type)
	}
	return nil
}

// diskOnImage: a file disk on a stored image (image = "ALIAS" or
// "sha256:HEX") is a qcow2 overlay vmsup makes on it at the first start.
func diskOnImage(d *Disk, fail diskFail) error {
	if d.Backing != "" {
		return fail("backing", "give image or backing, not both (image makes the disk an overlay on a stored image)")
	}
	if d.Format != FormatQcow2 {
		return fail("format", "a disk on an image is a qcow2 overlay, not %q", d.Format)
	}
	if strings.HasPrefix(d.Image, "sha256:") {
		if len(d.Image) != 71 || strings.Trim(d.Image[7:], "0123456789abcdef") != "" {
			return fail("image", "%q: a digest is sha256: and 64 lowercase hex digits", d.Image)
		}
		return nil
	}
	if err := ValidName(d.Image); err != nil {
		return fail("image", "%q: an alias of vmsup's image store (vmsup image ls) or a digest sha256:HEX", d.Image)
	}
	return nil
}

// diskFormat: the image format and size.
func diskFormat(d *Disk, fail diskFail) error {
	switch d.Format {
	case FormatQcow2, FormatRaw:
	default:
		return fail("format", "unknown format %q (want \"qcow2\" or \"raw\")", d.Format)
	}
	if d.IsCDROM() && d.Format != FormatRaw {
		return fail("format", "a CD-ROM image is raw, not %q", d.Format)
	}
	if d.Backing != "" && d.Format != FormatQcow2 {
		return fail("backing", "an overlay needs format \"qcow2\", not %q", d.Format)
	}
	if d.Size < 0 {
		return fail("size", "must not be negative")
	}
	if d.Size%512 != 0 {
		return fail("size", "%d is not a multiple of 512 bytes", d.Size)
	}
	return nil
}

// diskIO: cache, aio, serial and boot order.
func diskIO(d *Disk, fail diskFail) error {
	switch d.Cache {
	case "writeback", "none", "writethrough", "directsync", "unsafe":
	default:
		return fail("cache", "unknown cache mode %q", d.Cache)
	}
	switch d.AIO {
	case "threads", "io_uring":
	case "native":
		if d.Cache != "none" && d.Cache != "directsync" {
			return fail("aio", "aio \"native\" needs cache \"none\" or \"directsync\"")
		}
	default:
		return fail("aio", "unknown aio mode %q", d.AIO)
	}
	if (d.Type == DiskISCSI || d.Type == DiskRBD) && d.AIO != "threads" {
		return fail("aio", "applies only to file, block and iso disks (network drivers have their own I/O)")
	}
	if len(d.Serial) > 20 || strings.ContainsAny(d.Serial, ",\"' \n\x00") {
		return fail("serial", "serial %q must be at most 20 bytes with no spaces, quotes or commas", d.Serial)
	}
	if d.BootIndex < 0 {
		return fail("boot_index", "must not be negative")
	}
	return diskLimits(d, fail)
}

// diskLimits: I/O limits are not negative, and a total excludes its
// read/write pair.
func diskLimits(d *Disk, fail diskFail) error {
	l := d.IOLimits
	for _, v := range []struct {
		key string
		n   int64
	}{{"iops", int64(l.IOPS)}, {"iops_read", int64(l.IOPSRead)}, {"iops_write", int64(l.IOPSWrite)},
		{"bps", int64(l.BPS)}, {"bps_read", int64(l.BPSRead)}, {"bps_write", int64(l.BPSWrite)}} {
		if v.n < 0 {
			return fail(v.key, "must not be negative")
		}
	}
	if l.IOPS != 0 && (l.IOPSRead != 0 || l.IOPSWrite != 0) {
		return fail("iops", "give iops, or iops_read/iops_write, not both")
	}
	if l.BPS != 0 && (l.BPSRead != 0 || l.BPSWrite != 0) {
		return fail("bps", "give bps, or bps_read/bps_write, not both")
	}
	if l.Limited() && d.IsCDROM() {
		return fail("iops", "I/O limits apply to disks, not to a CD-ROM")
	}
	return nil
}

// ParseDisk parses a file describing one disk: the keys of a [[disk]] table
// at top level (as `vmsup disk attach --spec` takes). vmName fills the
// defaults that depend on the VM (a seed's meta-data). Relative paths are
// resolved against the file's directory, like in a VM file.
func ParseDisk(path string, data []byte, vmName string) (*Disk, error) {
	f := &File{Path: path, Raw: data, pos: positions(data)}
	var d Disk
	dec := toml.NewDecoder(bytes.NewReader(data)).DisallowUnknownFields()
	if err := dec.Decode(&d); err != nil {
		return nil, f.decodeError(err, reflect.TypeOf(Disk{}))
	}
	return f.finishDisk(&d, vmName)
}

// CheckDisk fills the defaults of a disk built in code (from command-line
// flags, say) and validates it; errors name source ("--file"). Give
// absolute paths: relative ones are taken relative to source's directory.
func CheckDisk(source string, d Disk, vmName string) (*Disk, error) {
	f := &File{Path: source}
	return f.finishDisk(&d, vmName)
}

func (f *File) finishDisk(d *Disk, vmName string) (*Disk, error) {
	d.applyDefaults(vmName)
	f.VM.Disks = []Disk{*d}
	f.resolvePaths()
	*d = f.VM.Disks[0]
	if err := f.validateDisk("", d); err != nil {
		return nil, err
	}
	return d, nil
}
