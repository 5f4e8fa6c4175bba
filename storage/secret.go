package storage

import (
	"bytes"
	"fmt"
	"os"
	"path/filepath"

	"github.com/vmsup/vmsup/internal/host/userfile"
	"github.com/vmsup/vmsup/internal/util/atomicfile"
)

// readSecret reads a secret file as users write it: QEMU's secret object
// takes the file's bytes verbatim, so the trailing newline an editor adds
// (which would make a CHAP password wrong) is dropped.
func readSecret(path string) ([]byte, error) {
	b, err := userfile.Read(path, userfile.MaxSecret)
	if err != nil {
		return nil, err
	}
	b = bytes.TrimRight(b, "\r\n")
	if len(b) == 0 {
		return nil, fmt.Errorf("%s is empty", path)
	}
	return b, nil
}

// writeSecret stores data at path, mode 0600, in a 0700 directory, replaced
// atomically.
func writeSecret(path string, data []byte) error {
	if err := os.MkdirAll(filepath.Dir(path), 0o700); err != nil {
		return err
	}
	if err := os.Chmod(filepath.Dir(path), 0o700); err != nil {
		return err
	}
	return atomicfile.WriteFile(path, data, 0o600)
}

// tempSecret writes data to a private temporary file for a probe and returns
// its path and a function that removes it.
func tempSecret(data []byte) (string, func(), error) {
	dir, err := os.MkdirTemp("", "vmsup-secret-")
	if err != nil {
		return "", nil, err
	}
	p := filepath.Join(dir, "secret")
	if err := os.WriteFile(p, data, 0o600); err != nil {
		os.RemoveAll(dir)
		return "", nil, err
	}
	return p, func() { os.RemoveAll(dir) }, nil
}
