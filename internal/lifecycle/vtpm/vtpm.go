// Package vtpm owns a VM's emulated TPM 2.0 on the host: swtpm's state
// directory (manufactured once by swtpm_setup, then kept with the VM's
// state over down/up), and the companion unit that runs swtpm for one QEMU.
//
// It does not start units or decide when: the supervisor does, with the
// unit this package describes. The TPM's live state (PCRs, sessions)
// reaches a migration destination inside QEMU's migration stream (QEMU's
// tpm-emulator fetches it from swtpm), so a destination's swtpm starts
// empty and nothing here copies files between hosts.
package vtpm

import (
	"context"
	"errors"
	"fmt"
	"io/fs"
	"os"
	"os/exec"
	"path/filepath"
	"strings"

	"github.com/vmsup/vmsup/units"
)

// Paths are one swtpm's files: its state directory and control socket.
type Paths struct {
	Dir    string // swtpm's --tpmstate and working directory
	Socket string // the control socket QEMU connects to (Dir/ctrl.sock)
}

// PathsFor are the TPM files of the QEMU that runs as the VM's unit alt
// ("" for the usual unit) in the VM's state directory: each unit its own,
// so a local migration's destination never shares its source's files.
func PathsFor(stateDir, alt string) Paths {
	dir := filepath.Join(stateDir, "tpm")
	if alt != "" {
		dir += "-" + alt
	}
	return Paths{Dir: dir, Socket: filepath.Join(dir, "ctrl.sock")}
}

// Binaries are swtpm's programs, found on PATH.
type Binaries struct{ Swtpm, Setup string }

// Find looks swtpm and swtpm_setup up; the error says what to install.
func Find() (Binaries, error) {
	var b Binaries
	var err1, err2 error
	b.Swtpm, err1 = exec.LookPath("swtpm")
	b.Setup, err2 = exec.LookPath("swtpm_setup")
	if err1 != nil || err2 != nil {
		return b, errors.New("swtpm is not installed (apt-get install swtpm swtpm-tools)")
	}
	return b, nil
}

// stateFile is what swtpm keeps a TPM 2.0's persistent state in.
const stateFile = "tpm2-00.permall"

// Manufactured reports whether dir holds a TPM's state.
func Manufactured(dir string) bool {
	_, err := os.Stat(filepath.Join(dir, stateFile))
	return err == nil
}

// Prepare makes the directory of p and, when manufacture is set and it
// holds no TPM yet, manufactures one there (an endorsement key, the
// SHA-256 PCR bank), then gives the whole directory to uid:gid, the user
// swtpm runs as. A TPM already there is kept: its NV indexes and keys are
// the guest's.
func Prepare(ctx context.Context, b Binaries, p Paths, manufacture bool, uid, gid int) error {
	if err := os.MkdirAll(p.Dir, 0o700); err != nil {
		return err
	}
	if manufacture && !Manufactured(p.Dir) {
		// Relative paths from inside the directory: swtpm's options
		// split at commas, which a state path may hold.
		cmd := exec.CommandContext(ctx, b.Setup, "--tpm2", "--tpmstate", ".", "--createek",
			"--pcr-banks", "sha256", "--not-overwrite")
		cmd.Dir = p.Dir
		if out, err := cmd.CombinedOutput(); err != nil {
			return fmt.Errorf("swtpm_setup: %w: %s", err, lastLine(out))
		}
	}
	if err := os.Remove(p.Socket); err != nil && !errors.Is(err, fs.ErrNotExist) {
		return err
	}
	return filepath.WalkDir(p.Dir, func(path string, _ fs.DirEntry, err error) error {
		if err != nil {
			return err
		}
		return os.Lchown(path, uid, gid)
	})
}

// Unit is the companion unit that runs swtpm for the QEMU of vmUnit:
// started before it, listening on p.Socket; --terminate ends it when its
// QEMU lets go of the socket. sb, when set, is its sandbox: QEMU's user,
// with nothing of the host writable but the TPM's directory (sb.User
// must be set; its paths are replaced).
func Unit(name, vm, vmUnit string, b Binaries, p Paths, sb *units.Sandbox) units.Unit {
	u := units.Unit{
		Name: name, Description: "vmsup: TPM of " + vm,
		Argv: []string{b.Swtpm, "socket", "--tpm2", "--tpmstate", "dir=.", "--ctrl", "type=unixio,path=ctrl.sock",
			"--terminate", "--log", "level=1"},
		WorkingDir: p.Dir, UMask: 0o077,
		TasksMax: 16, MemoryMax: 64 << 20,
		// Stopped after its QEMU at host shutdown: the guest's last TPM
		// commands are answered.
		Before:  []string{vmUnit},
		Collect: true,
	}
	if sb != nil {
		s := *sb
		s.ReadWritePaths, s.BindPaths = []string{p.Dir}, []string{p.Dir}
		s.HidePaths = []string{filepath.Dir(filepath.Dir(p.Dir))} // every VM's state directory
		s.HostNetwork, s.Devices, s.AppArmorProfile, s.AllowWriteExecute = false, nil, "", false
		u.Sandbox = &s
	}
	return u
}

func lastLine(out []byte) string {
	lines := strings.Split(strings.TrimSpace(string(out)), "\n")
	return lines[len(lines)-1]
}
