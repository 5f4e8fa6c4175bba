// Package identity keeps what makes a VM the same machine to its guest from
// one start to the next: its UUID and vmgenid generation id (generated at
// the first start, then recorded), and the files its systemd credentials
// reach QEMU through.
package identity

import (
	"cmp"
	"errors"
	"os"
	"path/filepath"

	"github.com/google/uuid"

	"github.com/vmsup/vmsup/internal/util/atomicfile"
	"github.com/vmsup/vmsup/spec"
)

// IDs are a VM's UUID and generation id.
type IDs struct {
	UUID  string
	GenID string
}

// Resolve returns the IDs a start uses: the file's uuid, else the recorded
// one, else a new one; the recorded generation id, else a new one. A
// generation id changes only when the guest's history forks (a clone, a
// snapshot revert), never at a plain restart.
func Resolve(vm *spec.VM, recorded IDs) IDs {
	return IDs{
		UUID:  cmp.Or(vm.UUID, recorded.UUID, uuid.NewString()),
		GenID: cmp.Or(recorded.GenID, uuid.NewString()),
	}
}

// credentialDir is under the state dir's "secrets" (0700, removed with it
// when QEMU is gone); its leading dot keeps it apart from disk secrets,
// whose names start with a letter or digit.
func credentialDir(stateDir string) string { return filepath.Join(stateDir, "secrets", ".credentials") }

// CredentialPaths returns, by name, the file each of vm's credentials is
// written to in stateDir.
func CredentialPaths(stateDir string, vm *spec.VM) map[string]string {
	if len(vm.Credentials) == 0 {
		return nil
	}
	out := map[string]string{}
	for name := range vm.Credentials {
		out[name] = filepath.Join(credentialDir(stateDir), name)
	}
	return out
}

// WriteCredentials writes each credential as the SMBIOS OEM string systemd
// reads ("io.systemd.credential:NAME=VALUE"), mode 0600, and removes files of
// credentials the spec no longer has.
func WriteCredentials(stateDir string, vm *spec.VM) error {
	if err := RemoveCredentials(stateDir); err != nil {
		return err
	}
	if len(vm.Credentials) == 0 {
		return nil
	}
	dir := credentialDir(stateDir)
	if err := os.MkdirAll(dir, 0o700); err != nil {
		return err
	}
	for _, d := range []string{filepath.Dir(dir), dir} {
		if err := os.Chmod(d, 0o700); err != nil {
			return err
		}
	}
	for name, p := range CredentialPaths(stateDir, vm) {
		if err := atomicfile.WriteFile(p, []byte(spec.CredentialPrefix+name+"="+vm.Credentials[name]), 0o600); err != nil {
			return err
		}
	}
	return nil
}

// RemoveCredentials removes the credential files (QEMU has read them when it
// built its SMBIOS tables). Idempotent.
func RemoveCredentials(stateDir string) error {
	err := os.RemoveAll(credentialDir(stateDir))
	if errors.Is(err, os.ErrNotExist) {
		return nil
	}
	return err
}

// KeepUUID: a file (want) without uuid, or with the one the VM runs with
// (recorded), asks for no change of it: running, the spec the VM runs,
// takes want's, so that a diff of the two sees none.
func KeepUUID(running, want *spec.VM, recorded string) {
	if want.UUID == "" || want.UUID == recorded {
		running.UUID = want.UUID
	}
}
