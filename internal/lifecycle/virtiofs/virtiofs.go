// Package virtiofs describes the virtiofsd of a VM's virtiofs share: its
// socket and the sandboxed companion unit that runs it, one per share, as
// QEMU's user. It does not start units (the supervisor does) nor find
// virtiofsd (hostcaps.VirtioFSD).
//
// virtiofsd is the Rust one (Debian 13's virtiofsd package, Fedora's); its
// own sandbox needs privileges the unit does not have, so it runs with
// --sandbox=none inside systemd's: the unit sees, of the host, only the
// shared folder (read-only unless the share is writable) and the
// directory of its socket.
package virtiofs

import (
	"path/filepath"

	"github.com/vmsup/vmsup/spec"
	"github.com/vmsup/vmsup/units"
)

// Paths are one share's virtiofsd files in the VM's state directory.
type Paths struct {
	Dir    string // virtiofsd's own directory (it creates the socket there)
	Socket string // the vhost-user socket QEMU connects to
}

// PathsFor are the files of the share tagged tag.
func PathsFor(stateDir, tag string) Paths {
	dir := filepath.Join(stateDir, "virtiofs-"+tag)
	return Paths{Dir: dir, Socket: filepath.Join(dir, "sock")}
}

// Argv is virtiofsd's command line for share sh.
func Argv(bin string, sh spec.Share, p Paths) []string {
	argv := []string{bin, "--socket-path=" + p.Socket, "--shared-dir=" + sh.Path, "--cache=auto", "--sandbox=none"}
	if sh.ReadOnly {
		argv = append(argv, "--readonly")
	}
	return argv
}

// Unit is the companion unit running virtiofsd for share sh of vm,
// ordered before the VM's unit vmUnit (it outlives QEMU's last requests at
// shutdown). sb, when set, is its sandbox (QEMU's user; its paths are
// replaced); stateRoot is the directory of every VM's state directory,
// hidden from it.
func Unit(name, vm, vmUnit, bin string, sh spec.Share, p Paths, stateRoot string, sb *units.Sandbox) units.Unit {
	u := units.Unit{
		Name: name, Description: "vmsup: virtiofs share " + sh.Tag + " of " + vm,
		Argv: Argv(bin, sh, p), TasksMax: 256, MemoryMax: 256 << 20,
		Before: []string{vmUnit}, Collect: true,
	}
	if sb != nil {
		s := *sb
		s.ReadWritePaths, s.BindPaths = []string{p.Dir}, []string{p.Dir, sh.Path}
		if !sh.ReadOnly {
			s.ReadWritePaths = append(s.ReadWritePaths, sh.Path)
		}
		s.HidePaths = []string{stateRoot}
		s.HostNetwork, s.Devices, s.AppArmorProfile, s.AllowWriteExecute = false, nil, "", false
		u.Sandbox = &s
	}
	return u
}
