package qmp

import (
	"context"
	"errors"

	"github.com/digitalocean/go-qemu/qmp"
)

// Typed wrappers for the QMP commands vmsup uses. Field names follow
// `man 7 qemu-qmp-ref` (QEMU 7.2); optional fields are pointers or omitempty.

// StatusInfo is query-status's reply.
type StatusInfo struct {
	Status     RunState `json:"status"`
	Running    bool     `json:"running"`
	Singlestep bool     `json:"singlestep"`
}

// QueryStatus returns the VM's run state.
func (c *Conn) QueryStatus(ctx context.Context) (StatusInfo, error) {
	var s StatusInfo
	err := c.Execute(ctx, "query-status", nil, &s)
	return s, err
}

// Stop pauses the vCPUs (QEMU then sends STOP).
func (c *Conn) Stop(ctx context.Context) error { return c.Execute(ctx, "stop", nil, nil) }

// Cont resumes the vCPUs (QEMU then sends RESUME).
func (c *Conn) Cont(ctx context.Context) error { return c.Execute(ctx, "cont", nil, nil) }

// SystemPowerdown presses the ACPI power button. It returns at once; the
// guest may ignore it. QEMU sends POWERDOWN, then SHUTDOWN if the guest
// powers off.
func (c *Conn) SystemPowerdown(ctx context.Context) error {
	return c.Execute(ctx, "system_powerdown", nil, nil)
}

// SystemReset resets the machine (QEMU then sends RESET).
func (c *Conn) SystemReset(ctx context.Context) error {
	return c.Execute(ctx, "system_reset", nil, nil)
}

// Quit makes QEMU exit at once, without a guest shutdown. The connection
// ends right after; a connection lost before the reply counts as success.
func (c *Conn) Quit(ctx context.Context) error {
	err := c.Execute(ctx, "quit", nil, nil)
	if errors.Is(err, ErrClosed) && !c.closedByUs() {
		return nil
	}
	return err
}

// KVMInfo is query-kvm's reply.
type KVMInfo struct {
	Enabled bool `json:"enabled"`
	Present bool `json:"present"`
}

// QueryKVM reports whether KVM is present and in use.
func (c *Conn) QueryKVM(ctx context.Context) (KVMInfo, error) {
	var k KVMInfo
	err := c.Execute(ctx, "query-kvm", nil, &k)
	return k, err
}

// QueryVersion returns the running QEMU's version.
func (c *Conn) QueryVersion(ctx context.Context) (qmp.Version, error) {
	var v qmp.Version
	err := c.Execute(ctx, "query-version", nil, &v)
	return v, err
}

// QueryName returns the VM name given with -name ("" if none).
func (c *Conn) QueryName(ctx context.Context) (string, error) {
	var n struct {
		Name string `json:"name"`
	}
	err := c.Execute(ctx, "query-name", nil, &n)
	return n.Name, err
}

// CPUInstanceProperties locate a vCPU in the topology. Absent ones are nil.
type CPUInstanceProperties struct {
	NodeID    *int64 `json:"node-id,omitempty"`
	SocketID  *int64 `json:"socket-id,omitempty"`
	DieID     *int64 `json:"die-id,omitempty"`
	ClusterID *int64 `json:"cluster-id,omitempty"`
	CoreID    *int64 `json:"core-id,omitempty"`
	ThreadID  *int64 `json:"thread-id,omitempty"`
}

// CPUInfoFast is one entry of query-cpus-fast.
type CPUInfoFast struct {
	CPUIndex int64                 `json:"cpu-index"`
	QOMPath  string                `json:"qom-path"`
	ThreadID int64                 `json:"thread-id"`
	Props    CPUInstanceProperties `json:"props"`
	Target   string                `json:"target"`
}

// QueryCPUsFast lists the vCPUs without interrupting them.
func (c *Conn) QueryCPUsFast(ctx context.Context) ([]CPUInfoFast, error) {
	var cpus []CPUInfoFast
	err := c.Execute(ctx, "query-cpus-fast", nil, &cpus)
	return cpus, err
}

// HotpluggableCPU is one entry of query-hotpluggable-cpus. QOMPath is empty
// for a slot that is not plugged; Type and Props are what device_add needs.
type HotpluggableCPU struct {
	Type       string                `json:"type"`
	VCPUsCount int64                 `json:"vcpus-count"`
	Props      CPUInstanceProperties `json:"props"`
	QOMPath    string                `json:"qom-path,omitempty"`
}

// QueryHotpluggableCPUs lists vCPU slots, plugged or not.
func (c *Conn) QueryHotpluggableCPUs(ctx context.Context) ([]HotpluggableCPU, error) {
	var cpus []HotpluggableCPU
	err := c.Execute(ctx, "query-hotpluggable-cpus", nil, &cpus)
	return cpus, err
}

// DeviceAdd plugs a device. args is a typed value marshalling to
// device_add's arguments ({"driver":..., "id":..., ...}).
func (c *Conn) DeviceAdd(ctx context.Context, args any) error {
	return c.Execute(ctx, "device_add", args, nil)
}

// DeviceDel asks the guest to release device id. Removal is complete only
// when DEVICE_DELETED arrives: subscribe before calling.
func (c *Conn) DeviceDel(ctx context.Context, id string) error {
	args := struct {
		ID string `json:"id"`
	}{id}
	return c.Execute(ctx, "device_del", args, nil)
}

// BlockdevAdd adds a block node; args marshals to blockdev-add's arguments.
func (c *Conn) BlockdevAdd(ctx context.Context, args any) error {
	return c.Execute(ctx, "blockdev-add", args, nil)
}

// BlockdevDel removes the block node nodeName (no device may use it).
func (c *Conn) BlockdevDel(ctx context.Context, nodeName string) error {
	args := struct {
		NodeName string `json:"node-name"`
	}{nodeName}
	return c.Execute(ctx, "blockdev-del", args, nil)
}

// ImageInfo is the image part of a BlockNode.
type ImageInfo struct {
	Filename    string `json:"filename"`
	Format      string `json:"format"`
	VirtualSize int64  `json:"virtual-size"`
	ActualSize  int64  `json:"actual-size,omitempty"`
	BackingFile string `json:"backing-filename,omitempty"`
}

// BlockNode is one entry of query-named-block-nodes (a subset of QEMU's
// BlockDeviceInfo).
type BlockNode struct {
	NodeName    string    `json:"node-name"`
	Driver      string    `json:"drv"`
	File        string    `json:"file"`
	ReadOnly    bool      `json:"ro"`
	Encrypted   bool      `json:"encrypted"`
	BackingFile string    `json:"backing_file,omitempty"`
	Image       ImageInfo `json:"image"`
	// DirtyBitmaps are the node's dirty bitmaps (see bitmap.go).
	DirtyBitmaps []DirtyBitmap `json:"dirty-bitmaps,omitempty"`
}

// QueryNamedBlockNodes lists block nodes, flat (each node once, without
// nested backing images; BackingFile still names the backing file).
func (c *Conn) QueryNamedBlockNodes(ctx context.Context) ([]BlockNode, error) {
	args := struct {
		Flat bool `json:"flat"`
	}{true}
	var nodes []BlockNode
	err := c.Execute(ctx, "query-named-block-nodes", args, &nodes)
	return nodes, err
}

// NetdevAdd adds a host network backend; args marshals to netdev_add's
// arguments ({"type":"tap","id":...,"fd":...}).
func (c *Conn) NetdevAdd(ctx context.Context, args any) error {
	return c.Execute(ctx, "netdev_add", args, nil)
}

// NetdevDel removes the network backend id.
func (c *Conn) NetdevDel(ctx context.Context, id string) error {
	args := struct {
		ID string `json:"id"`
	}{id}
	return c.Execute(ctx, "netdev_del", args, nil)
}

// ObjectAdd creates a QOM object; args marshals to object-add's arguments
// ({"qom-type":"memory-backend-ram","id":...,"size":...}).
func (c *Conn) ObjectAdd(ctx context.Context, args any) error {
	return c.Execute(ctx, "object-add", args, nil)
}

// ObjectDel deletes the QOM object id.
func (c *Conn) ObjectDel(ctx context.Context, id string) error {
	args := struct {
		ID string `json:"id"`
	}{id}
	return c.Execute(ctx, "object-del", args, nil)
}

// MemoryDevice is one entry of query-memory-devices: a DIMM (pc-dimm) and
// its backend.
type MemoryDevice struct {
	Type string `json:"type"` // "dimm", "nvdimm", "virtio-mem", ...
	Data struct {
		ID      string `json:"id,omitempty"`
		Addr    int64  `json:"addr"` // where the guest sees it (a DIMM's)
		Size    int64  `json:"size"`
		Memdev  string `json:"memdev"`
		Hotplug bool   `json:"hotplugged"`
	} `json:"data"`
}

// QueryMemoryDevices lists the plugged memory devices (not boot RAM).
func (c *Conn) QueryMemoryDevices(ctx context.Context) ([]MemoryDevice, error) {
	var ds []MemoryDevice
	err := c.Execute(ctx, "query-memory-devices", nil, &ds)
	return ds, err
}

// MemorySizeSummary is query-memory-size-summary: boot RAM and what DIMMs
// add.
type MemorySizeSummary struct {
	BaseMemory    int64 `json:"base-memory"`
	PluggedMemory int64 `json:"plugged-memory"`
}

// QueryMemorySizeSummary reports the guest's memory as QEMU sees it.
func (c *Conn) QueryMemorySizeSummary(ctx context.Context) (MemorySizeSummary, error) {
	var m MemorySizeSummary
	err := c.Execute(ctx, "query-memory-size-summary", nil, &m)
	return m, err
}

// ChardevInfo is one entry of query-chardev. FrontendOpen is, for a
// virtio-serial port, whether the guest has the port open (for the agent's
// port: whether qemu-ga runs).
type ChardevInfo struct {
	Label        string `json:"label"`
	Filename     string `json:"filename"`
	FrontendOpen bool   `json:"frontend-open"`
}

// FrontendOpen reports whether the guest has the character device label's
// port open (for the guest agent's: whether qemu-ga runs). Unknown (QEMU
// did not answer) counts as open: the caller's bounded wait finds out.
func (c *Conn) FrontendOpen(ctx context.Context, label string) bool {
	chs, err := c.QueryChardev(ctx)
	if err != nil {
		return true
	}
	for _, ch := range chs {
		if ch.Label == label {
			return ch.FrontendOpen
		}
	}
	return false
}

// QueryChardev lists QEMU's character devices.
func (c *Conn) QueryChardev(ctx context.Context) ([]ChardevInfo, error) {
	var cs []ChardevInfo
	err := c.Execute(ctx, "query-chardev", nil, &cs)
	return cs, err
}

// PCIDevice is one device of query-pci: the part vmsup reads (which root
// ports have something behind them).
type PCIDevice struct {
	QdevID    string     `json:"qdev_id"`
	PCIBridge *PCIBridge `json:"pci_bridge,omitempty"`
}

// PCIBridge is what sits behind a bridge or root port.
type PCIBridge struct {
	Devices []PCIDevice `json:"devices"`
}

// PCIBus is one bus of query-pci.
type PCIBus struct {
	Bus     int         `json:"bus"`
	Devices []PCIDevice `json:"devices"`
}

// QueryPCI lists the PCI buses and their devices.
func (c *Conn) QueryPCI(ctx context.Context) ([]PCIBus, error) {
	var bs []PCIBus
	err := c.Execute(ctx, "query-pci", nil, &bs)
	return bs, err
}

// QOMProperty is one entry of qom-list: a child object ("child<...>"
// types) or a property.
type QOMProperty struct {
	Name string `json:"name"`
	Type string `json:"type"`
}

// QOMList lists the children and properties of the QOM object at path:
// /machine/peripheral has the devices added with an id, /objects the
// objects added with object-add.
func (c *Conn) QOMList(ctx context.Context, path string) ([]QOMProperty, error) {
	args := struct {
		Path string `json:"path"`
	}{path}
	var ps []QOMProperty
	err := c.Execute(ctx, "qom-list", args, &ps)
	return ps, err
}

// Actions say what QEMU does on guest events (set-action, QEMU 6.0+); an
// empty field is left as it is.
type Actions struct {
	Reboot   string `json:"reboot,omitempty"`   // "reset" (default) or "shutdown"
	Shutdown string `json:"shutdown,omitempty"` // "poweroff" (default) or "pause"
	Panic    string `json:"panic,omitempty"`    // "pause", "shutdown", "exit-failure" or "none"
	Watchdog string `json:"watchdog,omitempty"`
}

// SetAction changes what QEMU does on guest events.
func (c *Conn) SetAction(ctx context.Context, a Actions) error {
	return c.Execute(ctx, "set-action", a, nil)
}

// HumanMonitorCommand runs an HMP command line and returns its output. Only
// for what QMP lacks (hostfwd_add); HMP output is text meant for people.
func (c *Conn) HumanMonitorCommand(ctx context.Context, cmdline string) (string, error) {
	args := struct {
		CommandLine string `json:"command-line"`
	}{cmdline}
	var out string
	err := c.Execute(ctx, "human-monitor-command", args, &out)
	return out, err
}
