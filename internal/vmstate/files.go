package vmstate

import (
	"io"
	"os"
	"syscall"
)

// CopyNew copies src to a new file dst (0600); dst must not exist.
func CopyNew(src, dst string) error {
	in, err := os.Open(src)
	if err != nil {
		return err
	}
	defer in.Close()
	out, err := os.OpenFile(dst, os.O_CREATE|os.O_EXCL|os.O_WRONLY, 0o600)
	if err != nil {
		return err
	}
	if _, err := io.Copy(out, in); err != nil {
		out.Close()
		os.Remove(dst)
		return err
	}
	return out.Close()
}

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
