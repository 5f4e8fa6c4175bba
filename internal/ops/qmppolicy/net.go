package qmppolicy

import (
	"slices"
	"strings"
)

const netdevAllows = `type "user" without hostfwd, guestfwd, smb or tftp; type "tap" on a tap vmsup made for this VM ` +
	`("ifname"), with script and downscript "no", and no fd, fds, vhostfd, vhostfds, helper or br`

func checkNetdevAdd(c *call) error {
	switch t, _ := str(c.args, "type"); t {
	case "user":
		return c.userNetdev()
	case "tap":
		return c.tapNetdev()
	case "socket", "stream", "dgram":
		return c.socketNetdev(t)
	case "l2tpv3", "vde", "vhost-user":
		return c.refuse(Outbound, "netdev type %q connects to the network or a host socket", t)
	case "bridge":
		return c.refuse(Program, `netdev type "bridge" runs a program (qemu-bridge-helper)`)
	case "vhost-vdpa":
		return c.refuse(HostPath, `netdev type "vhost-vdpa" opens a host vDPA device`)
	default:
		return c.refuse(Form, "netdev type %q is not on the allow-list (user, tap)", short(t))
	}
}

// userNetdev checks a slirp backend: no host listener, no connection to a
// host address, no program, no host directory.
func (c *call) userNetdev() error {
	if given(c.args, "hostfwd") {
		return c.refuse(Listener, "hostfwd listens on the host: give the NIC forwards in the VM's file")
	}
	if given(c.args, "guestfwd") {
		if g, _ := c.args["guestfwd"].([]any); slices.ContainsFunc(g, func(e any) bool {
			m, _ := e.(map[string]any)
			s, _ := str(m, "str")
			return strings.Contains(s, "-cmd:")
		}) {
			return c.refuse(Program, `guestfwd "cmd:" runs a program (QEMU's seccomp filter kills QEMU for it)`)
		}
		return c.refuse(Outbound, "guestfwd connects the guest to a host address")
	}
	if _, ok := c.args["smb"]; ok {
		return c.refuse(Program, "smb runs smbd on a host directory")
	}
	if dir, ok := c.args["tftp"]; ok {
		s, _ := dir.(string)
		return c.refuse(HostPath, "tftp serves the host directory %q to the guest", short(s))
	}
	return nil
}

// given reports whether m has key with a value other than an empty list.
func given(m map[string]any, key string) bool {
	v, ok := m[key]
	l, isList := v.([]any)
	return ok && (!isList || len(l) > 0)
}

// tapNetdev checks a tap backend: a tap vmsup made for this VM, opened by
// name, no script and no descriptor.
func (c *call) tapNetdev() error {
	for _, k := range []string{"fd", "fds", "vhostfd", "vhostfds"} {
		if _, ok := c.args[k]; ok {
			return c.refuse(Descriptor, "%s: a file descriptor, by name (vmsup's own) or QEMU's by number", k)
		}
	}
	if h, ok := str(c.args, "helper"); ok {
		return c.refuse(Program, "helper %q runs a program", short(h))
	}
	if _, ok := c.args["br"]; ok {
		return c.refuse(Program, "br runs a program (qemu-bridge-helper)")
	}
	for _, k := range []string{"script", "downscript"} {
		s, ok := str(c.args, k)
		if !ok {
			return c.refuse(Program, `%s is not given, and QEMU then runs a program (/etc/qemu-if*): give "no"`, k)
		}
		if s != "no" {
			return c.refuse(Program, `%s %q runs a program: give "no"`, k, short(s))
		}
	}
	ifname, _ := str(c.args, "ifname")
	if !slices.Contains(c.env.Taps, ifname) {
		return c.refuse(Form, "ifname %q is not a tap vmsup made for this VM (%s)", short(ifname), strings.Join(c.env.Taps, ", "))
	}
	return nil
}

// socketNetdev refuses a socket backend: each is a host listener or a
// connection.
func (c *call) socketNetdev(t string) error {
	class := Outbound
	switch {
	case t == "socket" && c.args["listen"] != nil,
		t == "stream" && c.args["server"] == true,
		t == "dgram" && c.args["local"] != nil && c.args["remote"] == nil:
		class = Listener
	}
	if class == Listener {
		return c.refuse(class, "netdev type %q opens a host socket that listens", t)
	}
	return c.refuse(class, "netdev type %q opens a host socket that connects out", t)
}

func checkMigrateURI(incoming bool) func(*call) error {
	return func(c *call) error {
		uri, ok := str(c.args, "uri")
		if !ok {
			return c.refuse(Form, "no uri")
		}
		scheme, rest, _ := strings.Cut(uri, ":")
		switch scheme {
		case "unix":
			return c.path("uri "+quote(uri)+": the socket", rest)
		case "exec":
			return c.refuse(Program, "uri %q runs a program (QEMU's seccomp filter kills QEMU for it): vmsup migrate moves VMs", short(uri))
		case "tcp", "rdma", "vsock":
			if incoming {
				return c.refuse(Listener, "uri %q listens on the network for a guest's memory: vmsup migrate moves VMs", short(uri))
			}
			return c.refuse(Export, "uri %q sends the guest's memory to a network address: vmsup migrate moves VMs", short(uri))
		case "fd":
			return c.refuse(Descriptor, "uri %q: a file descriptor (vmsup's own)", short(uri))
		}
		return c.refuse(Form, "uri %q: only unix: passes", short(uri))
	}
}

const objectAllows = `qom-type iothread, throttle-group, memory-backend-ram, memory-backend-memfd, rng-builtin, ` +
	`memory-backend-file ("mem-path" a path in the state directory or a directory on hugetlbfs), secret ("file" a ` +
	`path in the state directory), rng-random ("filename" /dev/urandom, /dev/random or a path in the state directory)`

func checkObjectAdd(c *call) error {
	if _, ok := c.args["props"]; ok {
		return c.refuse(Form, `"props" (gone since QEMU 6.0): give the properties beside qom-type`)
	}
	switch t, _ := str(c.args, "qom-type"); t {
	case "iothread", "throttle-group", "memory-backend-ram", "memory-backend-memfd", "rng-builtin":
		return nil
	case "memory-backend-file":
		mp, _ := str(c.args, "mem-path")
		if isHugetlbfsDir(mp) {
			return nil
		}
		return c.path("mem-path", mp)
	case "secret":
		if f, ok := c.args["file"]; ok {
			s, _ := f.(string)
			return c.path("file", s)
		}
		return nil
	case "rng-random":
		fn, ok := str(c.args, "filename")
		if !ok || fn == "/dev/urandom" || fn == "/dev/random" {
			return nil
		}
		return c.path("filename", fn)
	case "filter-dump", "input-linux", "tls-creds-x509", "tls-creds-psk", "tls-creds-anon":
		return c.refuse(HostPath, "qom-type %q reads or writes host files", t)
	case "pr-manager-helper", "rng-egd":
		return c.refuse(Outbound, "qom-type %q connects to a host socket", t)
	default:
		return c.refuse(Form, "qom-type %q is not on the allow-list", short(t))
	}
}

// deviceDrivers are the devices a raw device_add passes: those vmsup plugs.
func deviceDrivers() []string {
	return []string{"virtio-blk-pci", "virtio-scsi-pci", "scsi-hd", "scsi-cd", "ide-hd", "ide-cd", "virtio-net-pci", "pc-dimm"}
}

func checkDeviceAdd(c *call) error {
	d, _ := str(c.args, "driver")
	if !slices.Contains(deviceDrivers(), d) && !strings.HasSuffix(d, "-x86_64-cpu") && !strings.HasSuffix(d, "-i386-cpu") {
		switch d {
		case "vfio-pci":
			return c.refuse(HostPath, "driver \"vfio-pci\" passes a host PCI device: vmsup hostdev attach")
		case "loader", "guest-loader", "usb-host", "usb-mtp", "u2f-passthru":
			return c.refuse(HostPath, "driver %q reads host files or devices", d)
		}
		return c.refuse(Form, "driver %q is not on the allow-list (%s, vCPU types)", short(d), strings.Join(deviceDrivers(), ", "))
	}
	if rf, ok := c.args["romfile"]; ok {
		if s, _ := rf.(string); s != "" {
			return c.path("romfile", s)
		}
	}
	return nil
}

func checkQOMSet(c *call) error {
	if p, _ := str(c.args, "property"); p != "guest-stats-polling-interval" {
		return c.refuse(Form, `property %q: only the balloon's "guest-stats-polling-interval" passes`, short(p))
	}
	return nil
}

func checkHMP(c *call) error {
	line, _ := str(c.args, "command-line")
	if f := strings.Fields(line); len(f) == 0 || f[0] != "info" || strings.ContainsAny(line, "\r\n") {
		return c.refuse(Form, `HMP %q: only "info ..." passes`, short(line))
	}
	return nil
}
