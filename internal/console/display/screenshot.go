package display

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"errors"
	"fmt"
	"image"
	"os"
	"path/filepath"
	"syscall"
)

// Dumper is the QMP command a screenshot needs (*qmp.Conn has it).
type Dumper interface {
	Screendump(ctx context.Context, filename, device string) error
}

// maxDump bounds the file read back: MaxSide squared RGB and a header.
const maxDump = 3*MaxSide*MaxSide + 64

// Screenshot has QEMU write the guest's screen into dir (the VM's state
// directory, which QEMU's user may write) under a fresh name, reads it
// back and removes it. The file is QEMU's: it is opened without following
// a symlink, must be a regular file of at most maxDump bytes, and is
// decoded by a strict PPM reader, so a QEMU that put something else there
// gets an error back, never another file's contents.
func Screenshot(ctx context.Context, d Dumper, dir string) (*image.RGBA, error) {
	var rnd [6]byte
	if _, err := rand.Read(rnd[:]); err != nil {
		return nil, err
	}
	path := filepath.Join(dir, "screendump-"+hex.EncodeToString(rnd[:])+".ppm")
	defer os.Remove(path)
	if err := d.Screendump(ctx, path, ""); err != nil {
		return nil, fmt.Errorf("screendump: %w", err)
	}
	f, err := os.OpenFile(path, os.O_RDONLY|syscall.O_NOFOLLOW|syscall.O_NONBLOCK, 0)
	if err != nil {
		return nil, fmt.Errorf("screendump: %w", err)
	}
	defer f.Close()
	st, err := f.Stat()
	switch {
	case err != nil:
		return nil, fmt.Errorf("screendump: %w", err)
	case !st.Mode().IsRegular():
		return nil, fmt.Errorf("screendump: %s is not a regular file", path)
	case st.Size() > maxDump:
		return nil, fmt.Errorf("screendump: %s has %d bytes, more than a %dx%d screen", path, st.Size(), MaxSide, MaxSide)
	}
	img, err := DecodePPM(f)
	if err != nil {
		return nil, fmt.Errorf("screendump %s: %w", path, err)
	}
	return img, nil
}

// ErrNoDisplay is the error of a graphical operation on a VM without one.
var ErrNoDisplay = errors.New("no [display] (the VM has no video device)")
