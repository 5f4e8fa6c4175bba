package vmstore

import (
	"os"
	"syscall"
)

// Restore puts a record back as it was: old, or no file when old is nil.
func Restore(path string, old []byte) {
	if old == nil {
		os.Remove(path)
		return
	}
	_ = os.WriteFile(path, old, 0o600)
}

// ChownLike gives path the owner of ref (QEMU may run as the state
// directory's owner rather than root).
func ChownLike(path, ref string) error {
	fi, err := os.Stat(ref)
	if err != nil {
		return err
	}
	st, ok := fi.Sys().(*syscall.Stat_t)
	if !ok {
		return nil
	}
	return os.Lchown(path, int(st.Uid), int(st.Gid))
}
