package qemuargs

import (
	"context"
	"os"
	"os/exec"
	"strings"
	"testing"
	"time"

	"github.com/vmsup/vmsup/spec"
)

// TestHotplugJSONInQEMU hot-plugs a disk and a NIC into a VM's spare root
// ports with the values DiskBlockdevs, DiskDevice, NICNetdev and NICDevice
// return, sent as the arguments of blockdev-add, device_add and netdev_add:
// the same JSON Build puts on the command line must work over QMP.
func TestHotplugJSONInQEMU(t *testing.T) {
	env := needQEMU(t)
	for _, machine := range []string{"q35", "pc"} {
		t.Run(machine, func(t *testing.T) {
			tmp, err := os.MkdirTemp("", "qemuargs,hotplug")
			if err != nil {
				t.Fatal(err)
			}
			t.Cleanup(func() { os.RemoveAll(tmp) })
			slots := ""
			if machine == "q35" {
				slots = "hotplug_slots = 4\n"
			}
			f, err := spec.Parse(tmp+"/hp.toml", []byte(`name = "hp"
machine = "`+machine+`"
accel = "tcg"
memory = "128M"
`+slots+`
[[disk]]
name = "root"
file = "root.img"
`))
			if err != nil {
				t.Fatal(err)
			}
			if err := os.WriteFile(tmp+"/root.img", make([]byte, 1<<20), 0o644); err != nil {
				t.Fatal(err)
			}
			o := Options{Binary: env.qemu, Accel: spec.AccelTCG, QMPSocket: tmp + "/qmp.sock",
				EventSocket: tmp + "/events.sock", ConsoleSocket: tmp + "/console.sock", AgentSocket: tmp + "/qga.sock"}
			argv, err := Build(&f.VM, o)
			if err != nil {
				t.Fatal(err)
			}
			buses := SpareRootPorts(&f.VM)
			if machine == "pc" {
				buses = []string{PCIRootBus, PCIRootBus, PCIRootBus, PCIRootBus}
			}
			if len(buses) != 4 {
				t.Fatalf("SpareRootPorts = %q, want 4 ports", buses)
			}

			ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
			defer cancel()
			p, q := startQEMU(ctx, t, argv, o.QMPSocket, "-S")

			disk := spec.Disk{Name: "hot", Type: spec.DiskFile, File: tmp + "/hot,1.qcow2", Format: spec.FormatQcow2,
				Cache: "writethrough", AIO: "threads", Discard: true, Serial: "HOT1", ReadOnly: false}
			if out, err := exec.Command(env.qemuImg, "create", "-q", "-f", "qcow2", disk.File, "16M").CombinedOutput(); err != nil {
				t.Fatalf("qemu-img: %v\n%s", err, out)
			}
			dp, err := Disk(disk, DiskHost{}, buses[0])
			if err != nil {
				t.Fatal(err)
			}
			var plugged []renderer
			for _, b := range dp.Blockdevs {
				if err := q.run("blockdev-add", b, nil); err != nil {
					p.fail("%v", err)
				}
				plugged = append(plugged, b)
			}
			nic := spec.NIC{Name: "hot", Type: spec.NICUser, MAC: "52:54:00:00:00:99",
				Forwards: []string{"tcp:127.0.0.1:0-:22"}}
			nd, err := NICNetdev(nic, false)
			if err != nil {
				t.Fatal(err)
			}
			nicDev := NICDevice(nic, buses[1])
			for _, step := range []struct {
				cmd string
				arg renderer
			}{{"device_add", dp.Devices[0]}, {"netdev_add", nd}, {"device_add", nicDev}} {
				if err := q.run(step.cmd, step.arg, nil); err != nil {
					p.fail("%s: %v", step.cmd, err)
				}
				plugged = append(plugged, step.arg)
			}

			// A CD-ROM (its own virtio-scsi controller) and a disk on an
			// iothread (object-add): every part type of Disk over QMP.
			cd := spec.Disk{Name: "cd", Type: spec.DiskISO, File: tmp + "/cd.iso", Format: spec.FormatRaw,
				ReadOnly: true, Cache: "writeback", AIO: "threads"}
			io := spec.Disk{Name: "io", Type: spec.DiskFile, File: tmp + "/io.img", Format: spec.FormatRaw,
				Cache: "writeback", AIO: "threads", IOThread: true}
			for i, d := range []spec.Disk{cd, io} {
				if err := os.WriteFile(d.File, make([]byte, 1<<20), 0o644); err != nil {
					t.Fatal(err)
				}
				dp, err := Disk(d, DiskHost{}, buses[2+i])
				if err != nil {
					t.Fatal(err)
				}
				for _, o := range dp.Objects {
					if err := q.run("object-add", o, nil); err != nil {
						p.fail("object-add: %v", err)
					}
					plugged = append(plugged, o)
				}
				for _, b := range dp.Blockdevs {
					if err := q.run("blockdev-add", b, nil); err != nil {
						p.fail("blockdev-add: %v", err)
					}
					plugged = append(plugged, b)
				}
				for _, dev := range dp.Devices {
					if err := q.run("device_add", dev, nil); err != nil {
						p.fail("device_add: %v", err)
					}
					plugged = append(plugged, dev)
				}
			}
			var iothreads []struct {
				ID string `json:"id"`
			}
			if err := q.run("query-iothreads", nil, &iothreads); err != nil || len(iothreads) != 1 || iothreads[0].ID != DiskIOThreadID("io") {
				p.fail("query-iothreads: %+v %v", iothreads, err)
			}

			// Everything plugged must now look exactly as if it had been on
			// the command line.
			all := append([]string(nil), argv...)
			for _, r := range plugged {
				a, err := r.Args()
				if err != nil {
					t.Fatal(err)
				}
				all = append(all, a...)
			}
			if err := checkState(q, all); err != nil {
				p.fail("%v", err)
			}
			p.quit(ctx, q)
		})
	}
}

// TestDiskRecordedBeforeBus: a disk recorded before bus and device existed
// (an attached disk in an old record, no defaults filled) renders as it
// was plugged: a virtio-blk, or a CD-ROM on its SCSI controller, so that its
// detach names the device QEMU has.
func TestDiskRecordedBeforeBus(t *testing.T) {
	for _, c := range []struct {
		d    spec.Disk
		want []string
	}{
		{spec.Disk{Name: "d", Type: spec.DiskFile, File: "/x.img", Format: spec.FormatRaw, Cache: "writeback", AIO: "threads"}, []string{"virtio-blk-pci"}},
		{spec.Disk{Name: "cd", Type: spec.DiskISO, File: "/x.iso", Format: spec.FormatRaw, Cache: "writeback", AIO: "threads"}, []string{"virtio-scsi-pci", "scsi-cd"}},
	} {
		p, err := Disk(c.d, DiskHost{}, "rp1")
		if err != nil {
			t.Fatal(err)
		}
		var got []string
		for _, d := range p.Devices {
			got = append(got, d.Driver)
		}
		if strings.Join(got, ",") != strings.Join(c.want, ",") {
			t.Errorf("disk %s without bus/device: devices %v, want %v", c.d.Name, got, c.want)
		}
	}
}
