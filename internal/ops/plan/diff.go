package plan

import (
	"fmt"
	"reflect"
	"slices"
	"strings"

	"github.com/vmsup/vmsup/spec"
)

// rule classes one spec key; keys without a rule need a restart.
type rule struct {
	class Class
	kind  Kind
	op    string
	why   string
	warn  string
}

const startWhy = "QEMU takes it when it starts"

// nicFilterOp is how a network NIC's filter changes live.
const nicFilterOp = "nftables: the tap's filter tables replaced"

// DIMMStep is the granule of memory hotplug (devices.SetMemory's).
const DIMMStep = 128 * spec.MiB

// rules for the VM's own keys, by TOML path ("boot.*" covers a table).
var rules = map[string]rule{
	"description":            {class: Live, kind: RecordOnly, op: "record"},
	"shutdown":               {class: Live, kind: RecordOnly, op: "record (read by the stop hook)"},
	"autostart":              {class: Live, kind: Autostart, op: "systemd: enable or disable at boot"},
	"limits.cpu_quota":       {class: Live, kind: UnitLimits, op: "unit property CPUQuotaPerSecUSec"},
	"limits.cpu_weight":      {class: Live, kind: UnitLimits, op: "unit property CPUWeight"},
	"limits.tasks_max":       {class: Live, kind: UnitLimits, op: "unit property TasksMax"},
	"limits.memory_overhead": {class: Live, kind: UnitLimits, op: "unit property MemoryMax"},
	"health.*":               {class: Live, kind: RecordOnly, op: "record (read by the next restart)"},
	"on_crash":               {class: Live, kind: RecordOnly, op: "record (read by the stop-post hook)"},
	"restart_limit":          {class: Live, kind: RecordOnly, op: "record (read by the stop-post hook)"},
	"restart_window":         {class: Live, kind: RecordOnly, op: "record (read by the stop-post hook)"},
	"on_panic":               {class: Restart, why: "the pvpanic device and QEMU's panic action are set when it starts"},
	"watchdog":               {class: Restart, why: "the watchdog is a device made when QEMU starts"},
	"watchdog_model":         {class: Restart, why: "the watchdog is a device made when QEMU starts", warn: "the guest sees another watchdog"},
	"console.*":              {class: Restart, why: "the console log's writer starts with QEMU"},
	"boot.*":                 {class: Reboot, why: "the firmware and kernel read it at boot"},
	"machine":                {class: Restart, why: "the machine type is fixed when QEMU starts", warn: "the guest sees another chipset"},
	"accel":                  {class: Restart, why: "the accelerator is chosen when QEMU starts"},
	"cpu_model":              {class: Restart, why: "the CPU model is fixed when QEMU starts", warn: "the guest sees another CPU"},
	"max_cpus":               {class: Restart, why: "vCPU hotplug slots are made when QEMU starts"},
	"max_memory":             {class: Restart, why: "the memory hotplug ceiling is fixed when QEMU starts"},
	"hotplug_slots":          {class: Restart, why: "root ports are made when QEMU starts", warn: "PCI addresses of the VM's devices may change"},
	"stop_timeout":           {class: Restart, why: "the unit's stop timeout is fixed when it starts"},
	"guest_agent":            {class: Restart, why: "the agent channel is a device made when QEMU starts"},
	"balloon":                {class: Restart, why: "the balloon is a device made when QEMU starts"},
	"balloon_target":         {class: Live, kind: Balloon, op: "balloon (QMP)"},
	"security.*":             {class: Restart, why: "the confinement is set up when the unit starts"},
	"boot.strict":            {class: Restart, why: "QEMU passes the boot policy to the firmware when it starts"},
	"uuid":                   {class: Restart, why: "QEMU builds the firmware tables when it starts", warn: "the guest sees another machine UUID"},
	"credentials":            {class: Restart, why: "QEMU reads the credential files when it starts (the guest's systemd at boot)"},
	"smbios.*":               {class: Restart, why: "QEMU builds the SMBIOS tables when it starts"},
	"pinning.vcpus":          {class: Live, kind: Pinning, op: "sched_setaffinity of each vCPU thread"},
	"pinning.emulator":       {class: Restart, why: "the unit's CPUAffinity= is set when it starts"},
	"numa":                   {class: Restart, why: "the guest's NUMA nodes are fixed when QEMU starts"},
	"display.*":              {class: Restart, why: "the video device, tablet and VNC server are made when QEMU starts"},
	"cpu.*":                  {class: Restart, why: "the CPU's features are fixed when QEMU starts", warn: "the guest sees another CPU"},
	"rtc":                    {class: Restart, why: "QEMU sets the RTC's base when it starts"},
	"hugepages":              {class: Restart, why: "QEMU maps the guest's memory when it starts"},
	"shared_memory":          {class: Restart, why: "QEMU maps the guest's memory when it starts"},
	"vsock.*":                {class: Restart, why: "the vsock device and its CID are set when QEMU starts"},
	"hostdev":                {class: Restart, why: "host PCI devices are bound to vfio-pci and given to QEMU when it starts"},
	"topology.*":             {class: Restart, why: "the vCPU topology is fixed when QEMU starts", warn: "the guest sees another CPU layout"},
	"tpm":                    {class: Restart, why: "the TPM is a device made when QEMU starts"},
	"tpm.*":                  {class: Restart, why: "the TPM is a device made when QEMU starts"},
	"share":                  {class: Restart, why: "QEMU cannot hot-plug a shared folder (no fsdev_add in QMP)"},
	"security_group":         {class: Live, kind: NICFilter, op: nicFilterOp},
}

func ruleFor(path string) rule {
	if r, ok := rules[path]; ok {
		return r
	}
	if i := strings.IndexByte(path, '.'); i > 0 {
		if r, ok := rules[path[:i]+".*"]; ok {
			return r
		}
	}
	return rule{class: Restart, why: startWhy}
}

// fields compares the VM's own keys (devices and resources are done by
// devices and resources), recursing into tables.
func (d *differ) fields(prefix string, a, b reflect.Value) {
	t := a.Type()
	for i := 0; i < t.NumField(); i++ {
		sf := t.Field(i)
		key := strings.Split(sf.Tag.Get("toml"), ",")[0]
		if prefix == "" && (key == "name" || key == "disk" || key == "nic" || key == "cpus" || key == "memory") {
			continue
		}
		path := prefix + key
		if sf.Anonymous {
			path = strings.TrimSuffix(prefix, ".")
		}
		av, bv := a.Field(i), b.Field(i)
		if av.Kind() == reflect.Struct && !isScalar(av) {
			d.fields(withDot(path), av, bv)
			continue
		}
		if same(av, bv) {
			continue
		}
		r := ruleFor(path)
		d.add(Change{Field: path, From: show(av), To: show(bv), Class: r.class, Kind: r.kind, Op: r.op, Why: r.why, Warn: r.warn})
	}
}

func withDot(p string) string {
	if p == "" {
		return ""
	}
	return p + "."
}

// isScalar: struct types that are values in TOML (none today; sizes and
// durations are integers).
func isScalar(v reflect.Value) bool {
	_, ok := v.Interface().(fmt.Stringer)
	return ok
}

// show renders a value as the file would have it.
func show(v reflect.Value) string {
	for v.Kind() == reflect.Pointer {
		if v.IsNil() {
			return ""
		}
		v = v.Elem()
	}
	switch x := v.Interface().(type) {
	case spec.Size:
		if x == 0 {
			return "0"
		}
		return x.String()
	case spec.Duration:
		return x.D().String()
	case string:
		if x == "" {
			return ""
		}
		return fmt.Sprintf("%q", x)
	}
	if v.Kind() == reflect.Map { // credentials: their names, never their values
		var names []string
		for _, k := range v.MapKeys() {
			names = append(names, k.String())
		}
		slices.Sort(names)
		return "{" + strings.Join(names, ", ") + "}"
	}
	if v.Kind() == reflect.Slice {
		var parts []string
		for i := 0; i < v.Len(); i++ {
			parts = append(parts, show(v.Index(i)))
		}
		return "[" + strings.Join(parts, ", ") + "]"
	}
	if _, ok := v.Interface().(fmt.Stringer); !ok && v.Kind() == reflect.Struct {
		// A table (a security group): inline, as TOML writes it.
		var parts []string
		for i := 0; i < v.NumField(); i++ {
			key := strings.Split(v.Type().Field(i).Tag.Get("toml"), ",")[0]
			if key == "" || key == "-" || v.Field(i).IsZero() {
				continue
			}
			parts = append(parts, key+" = "+show(v.Field(i)))
		}
		return "{" + strings.Join(parts, ", ") + "}"
	}
	return fmt.Sprint(v.Interface())
}

// resources: vCPUs and memory, live within what QEMU booted with.
func (d *differ) resources(run, want *spec.VM) {
	if r, w := run.CPUs, want.CPUs; r != w {
		c := Change{Field: "cpus", From: fmt.Sprint(r), To: fmt.Sprint(w), Class: Restart}
		switch {
		case w > r && w <= run.MaxCPUs:
			c.Class, c.Kind, c.Op, c.Guest = Live, CPUs, "device_add of vCPUs", "online the new vCPUs (the guest agent does, where it answers)"
		case w > r:
			c.Why = fmt.Sprintf("above the max_cpus (%d) QEMU started with", run.MaxCPUs)
		default:
			c.Why = "QEMU 7.2 does not complete a vCPU unplug"
		}
		d.add(c)
	}
	if r, w := run.Memory, want.Memory; r != w {
		c := Change{Field: "memory", From: r.String(), To: w.String(), Class: Restart}
		switch {
		case (w-r)%DIMMStep != 0:
			c.Why = "memory is hot-plugged in steps of 128M (Linux onlines it in 128 MiB blocks)"
		case w > r && w <= run.MaxMemory:
			c.Class, c.Kind, c.Op, c.Guest = Live, Memory, "device_add of a pc-dimm", "online the new memory (the guest agent does, where it answers)"
		case w > r:
			c.Why = fmt.Sprintf("above the max_memory (%s) QEMU started with", run.MaxMemory)
		case w >= d.facts.BootMemory:
			c.Class, c.Kind, c.Op, c.Guest = Live, Memory, "device_del of the DIMMs added since boot", "release the memory (online_movable)"
		default:
			c.Why = fmt.Sprintf("below the %s QEMU booted with (only DIMMs added since can go)", d.facts.BootMemory)
		}
		d.add(c)
	}
}

// devices: disks and NICs matched by name.
func (d *differ) devices(run, want *spec.VM) {
	for _, r := range run.Disks {
		if !slices.ContainsFunc(want.Disks, func(w spec.Disk) bool { return w.Name == r.Name }) {
			c := Change{Field: fmt.Sprintf("disk[%s]", r.Name), From: diskLabel(r), Class: Live, Kind: DiskRemove, Name: r.Name,
				Op: "device_del, blockdev-del", Guest: "release the disk (unmount it) before apply"}
			d.add(notOnSATA(c, r))
		}
	}
	for _, r := range run.NICs {
		if !slices.ContainsFunc(want.NICs, func(w spec.NIC) bool { return w.Name == r.Name }) {
			d.add(Change{Field: fmt.Sprintf("nic[%s]", r.Name), From: r.Type, Class: Live, Kind: NICRemove, Name: r.Name,
				Op: "device_del, netdev_del"})
		}
	}
	for _, w := range want.Disks {
		i := slices.IndexFunc(run.Disks, func(r spec.Disk) bool { return r.Name == w.Name })
		if i >= 0 {
			d.disk(run.Disks[i], w)
			continue
		}
		if slices.Contains(d.facts.KeptDisks, w.Name) {
			d.add(Change{Field: fmt.Sprintf("disk[%s]", w.Name), Class: Impossible, Name: w.Name,
				Why: "a disk of that name was attached by hand (vmsup disk attach) and differs; detach it first"})
			continue
		}
		c := Change{Field: fmt.Sprintf("disk[%s]", w.Name), To: diskLabel(w), Kind: DiskAdd, Name: w.Name,
			Op: "blockdev-add, device_add"}
		if w.Bus == spec.BusSATA {
			d.add(notOnSATA(c, w))
			continue
		}
		if why, ok := d.facts.NotLive[w.Name]; ok {
			c.Class, c.Kind, c.Op, c.Why = Restart, NotLiveKind, "", why
			d.add(c)
			continue
		}
		d.add(d.plug(c))
	}
	for _, w := range want.NICs {
		i := slices.IndexFunc(run.NICs, func(r spec.NIC) bool { return r.Name == w.Name })
		if i >= 0 {
			d.nic(run.NICs[i], w)
			continue
		}
		if slices.Contains(d.facts.KeptNICs, w.Name) {
			d.add(Change{Field: fmt.Sprintf("nic[%s]", w.Name), Class: Impossible, Name: w.Name,
				Why: "a NIC of that name was attached by hand (vmsup nic attach) and differs; detach it first"})
			continue
		}
		c := Change{Field: fmt.Sprintf("nic[%s]", w.Name), To: w.Type, Kind: NICAdd, Name: w.Name,
			Op: "netdev_add, device_add", Guest: "bring the new NIC up"}
		if why := d.facts.TapsNotLive; why != "" && w.UsesTap() {
			c.Class, c.Kind, c.Op, c.Guest, c.Why = Restart, NotLiveKind, "", "", why
			d.add(c)
			continue
		}
		d.add(d.plug(c))
	}
}

// notOnSATA makes a SATA disk's addition or removal a restart: QEMU's
// AHCI controller has no hotplug.
func notOnSATA(c Change, dk spec.Disk) Change {
	if dk.Bus != spec.BusSATA {
		return c
	}
	c.Class, c.Kind, c.Op, c.Guest = Restart, NotLiveKind, "", ""
	c.Why = "QEMU's AHCI (bus \"sata\") has no hotplug"
	return c
}

// plug makes an addition live while hotplug slots are left.
func (d *differ) plug(c Change) Change {
	if d.slots > 0 {
		d.slots--
		c.Class = Live
		return c
	}
	c.Class, c.Kind, c.Op, c.Guest = Restart, NotLiveKind, "", ""
	c.Why = "no free hotplug slot (hotplug_slots)"
	return c
}

func diskLabel(dk spec.Disk) string {
	switch dk.Type {
	case spec.DiskFile, spec.DiskBlock, spec.DiskISO:
		return fmt.Sprintf("%s %s", dk.Type, dk.File)
	case spec.DiskRBD:
		return fmt.Sprintf("rbd %s/%s", dk.Pool, dk.Image)
	case spec.DiskISCSI:
		return fmt.Sprintf("iscsi %s/%d", dk.Target, dk.LUN)
	}
	return dk.Type
}

// disk compares one disk kept by name.
func (d *differ) disk(r, w spec.Disk) {
	field := fmt.Sprintf("disk[%s]", w.Name)
	if r.IOLimits != w.IOLimits {
		d.add(Change{Field: field + ".io-limits", From: IOLimits(r.IOLimits), To: IOLimits(w.IOLimits), Class: Live, Kind: DiskLimits,
			Name: w.Name, Op: "block_set_io_throttle"})
	}
	r.IOLimits, w.IOLimits = spec.IOLimits{}, spec.IOLimits{}
	sameFile := r.Type == w.Type && r.File == w.File
	if r.Type == spec.DiskISO && w.Type == spec.DiskISO && r.File != w.File {
		d.add(Change{Field: field + ".file", From: r.File, To: w.File, Class: Live, Kind: DiskMedium, Name: w.Name,
			Op: "blockdev-open-tray, blockdev-remove-medium, blockdev-insert-medium", Guest: "sees a media change"})
		r.File = w.File
	}
	if r.Size != w.Size && sameFile && r.Type == spec.DiskFile {
		c := Change{Field: field + ".size", From: r.Size.String(), To: w.Size.String(), Name: w.Name}
		why, snapshotted := d.facts.Snapshotted[w.Name]
		switch {
		case w.Size > r.Size && snapshotted:
			c.Class, c.Why = Impossible, why
		case w.Size > r.Size:
			c.Class, c.Kind, c.Op, c.Guest = Live, DiskGrow, "block_resize", "grow its partition and filesystem"
		case w.Size == 0:
			c.Class, c.Kind, c.Op = Live, RecordOnly, "record (the image keeps its size)"
		default:
			c.Class, c.Why = Impossible, "shrinking an image loses what is past the new end; vmsup only grows"
		}
		d.add(c)
		r.Size = w.Size
	}
	if sameFile && r.Type == spec.DiskFile {
		if r.Format != w.Format {
			d.add(Change{Field: field + ".format", From: r.Format, To: w.Format, Class: Impossible, Name: w.Name,
				Why: fmt.Sprintf("the image %s is %s: converting it is qemu-img convert's job, then name the new file", r.File, r.Format)})
			r.Format = w.Format
		}
		if r.Backing != w.Backing {
			d.add(Change{Field: field + ".backing", From: r.Backing, To: w.Backing, Class: Impossible, Name: w.Name,
				Why: "the image exists and names its backing file itself (qemu-img rebase changes it)"})
			r.Backing = w.Backing
		}
		if r.Image != w.Image {
			d.add(Change{Field: field + ".image", From: orNone(r.Image), To: orNone(w.Image), Class: Impossible, Name: w.Name,
				Why: fmt.Sprintf("the disk's overlay %s exists on the image it was made on; give the disk another file to make it on the new image (a restart)", r.File)})
			r.Image = w.Image
		}
	}
	if r.BootIndex != w.BootIndex {
		d.add(Change{Field: field + ".boot_index", From: fmt.Sprint(r.BootIndex), To: fmt.Sprint(w.BootIndex), Class: Reboot,
			Name: w.Name, Why: "the firmware reads the boot order at boot"})
		r.BootIndex = w.BootIndex
	}
	d.rest(field, "QEMU fixes it when it opens the disk", reflect.ValueOf(r), reflect.ValueOf(w))
}

// IOLimits renders a disk's I/O limits as plan and status show them:
// "iops=500,bps=1048576", or "unlimited".
func IOLimits(l spec.IOLimits) string {
	if !l.Limited() {
		return "unlimited"
	}
	var parts []string
	for _, p := range []struct {
		k string
		v int64
	}{{"iops", int64(l.IOPS)}, {"iops_read", int64(l.IOPSRead)}, {"iops_write", int64(l.IOPSWrite)},
		{"bps", int64(l.BPS)}, {"bps_read", int64(l.BPSRead)}, {"bps_write", int64(l.BPSWrite)}} {
		if p.v != 0 {
			parts = append(parts, fmt.Sprintf("%s=%d", p.k, p.v))
		}
	}
	return strings.Join(parts, ",")
}

// nic compares one NIC kept by name.
func (d *differ) nic(r, w spec.NIC) {
	field := fmt.Sprintf("nic[%s]", w.Name)
	if r.LinkIsUp() != w.LinkIsUp() {
		d.add(Change{Field: field + ".link", From: linkState(r), To: linkState(w), Class: Live, Kind: NICLink, Name: w.Name,
			Op: "set_link"})
	}
	r.Link, w.Link = "", ""
	if r.AllowSpoofing != w.AllowSpoofing {
		d.add(Change{Field: field + ".allow_spoofing", From: fmt.Sprint(r.AllowSpoofing), To: fmt.Sprint(w.AllowSpoofing), Class: Live, Kind: NICFilter, Name: w.Name, Op: nicFilterOp})
	}
	if !slices.Equal(r.SecurityGroups, w.SecurityGroups) {
		d.add(Change{Field: field + ".security_groups", From: strings.Join(r.SecurityGroups, ","), To: strings.Join(w.SecurityGroups, ","), Class: Live, Kind: NICFilter, Name: w.Name, Op: nicFilterOp})
	}
	r.AllowSpoofing, w.AllowSpoofing, r.SecurityGroups, w.SecurityGroups = false, false, nil, nil
	if r.MAC != w.MAC {
		d.add(Change{Field: field + ".mac", From: r.MAC, To: w.MAC, Class: Restart, Name: w.Name,
			Why: "QEMU fixes it when it creates the NIC", Warn: "the guest sees a new MAC address"})
		r.MAC = w.MAC
	}
	d.rest(field, "QEMU fixes it when it creates the NIC", reflect.ValueOf(r), reflect.ValueOf(w))
}

func linkState(n spec.NIC) string {
	if n.LinkIsUp() {
		return spec.LinkUp
	}
	return spec.LinkDown
}

// rest lists a device's other differing keys, each needing a restart.
func (d *differ) rest(field, why string, a, b reflect.Value) {
	t := a.Type()
	for i := 0; i < t.NumField(); i++ {
		av, bv := a.Field(i), b.Field(i)
		if t.Field(i).Anonymous {
			d.rest(field, why, av, bv)
			continue
		}
		if same(av, bv) {
			continue
		}
		key := strings.Split(t.Field(i).Tag.Get("toml"), ",")[0]
		d.add(Change{Field: field + "." + key, From: show(av), To: show(bv), Class: Restart, Why: why})
	}
}

// same compares two values of a key, an empty list equal to none (a record
// read back may have either).
func same(a, b reflect.Value) bool {
	if a.Kind() == reflect.Slice && a.Len() == 0 && b.Len() == 0 {
		return true
	}
	return reflect.DeepEqual(a.Interface(), b.Interface())
}
