// Package qmpfds hands QEMU the files a raw QMP command names as
// descriptors. A raw command that passed the policy (package qmppolicy)
// still names files of the VM's state directory, and QEMU would resolve
// those names again when it opens them: a symlink swapped in between, or a
// hard link to a host file, would give it another file than the one
// checked. So vmsup opens each file itself, beneath the state directory
// without following a symlink and with QEMU's own permissions, checks the
// object it got, and passes QEMU the descriptor (/dev/fdset/N) in the
// name's place. It does not decide what passes (qmppolicy does) or log.
package qmpfds

import (
	"context"
	"fmt"
	"os"
	"path/filepath"

	"golang.org/x/sys/unix"

	"github.com/vmsup/vmsup/internal/ops/qmppolicy"
	"github.com/vmsup/vmsup/qmp"
	"github.com/vmsup/vmsup/storage"
)

// Files are the opened files of one raw command: per qmppolicy
// HostFile, one descriptor per open mode QEMU may ask for.
type Files struct {
	files [][]*os.File
	sets  []int64 // the fd sets added, to take back if the command fails
}

// Close closes every descriptor (QEMU keeps its own copies).
func (r *Files) Close() {
	for _, fs := range r.files {
		for _, f := range fs {
			f.Close()
		}
	}
}

// Open opens and checks the files d names, beneath the VM's state
// directory dir and as the user of QEMU's process pid. A file that is not
// one the VM may be given (outside the state directory, through a symlink,
// hard-linked, not a regular file or block device, not QEMU's to open) is
// a *qmppolicy.Refusal of class HostPath; other errors are vmsup's.
func Open(ctx context.Context, c *qmp.Conn, dir string, pid int, d *qmppolicy.Decision) (*Files, error) {
	cred, err := storage.ProcCred(pid)
	if err != nil {
		return nil, fmt.Errorf("qmp: QEMU's user: %w", err)
	}
	r := &Files{}
	for _, hf := range d.Files {
		modes, err := fileModes(ctx, c, hf)
		if err != nil {
			r.Close()
			return nil, fmt.Errorf("qmp: %s: %w", hf.Field, err)
		}
		var fs []*os.File
		for _, flags := range modes {
			f, err := openFile(dir, hf.Path, flags, cred)
			if err != nil {
				r.Close()
				for _, f := range fs {
					f.Close()
				}
				return nil, &qmppolicy.Refusal{Command: d.Command.Execute, Class: qmppolicy.HostPath,
					Reason: fmt.Sprintf("%s: %v", hf.Field, err), Err: err}
			}
			fs = append(fs, f)
		}
		r.files = append(r.files, fs)
	}
	return r, nil
}

// fileModes are the open flags of the descriptors QEMU may ask for: a
// read-write file may also be opened read-only (a backing child,
// auto-read-only), so it gets both.
func fileModes(ctx context.Context, c *qmp.Conn, hf *qmppolicy.HostFile) ([]int, error) {
	mode := hf.Mode
	if mode == qmppolicy.MediumMode {
		blocks, err := c.QueryBlock(ctx)
		if err != nil {
			return nil, fmt.Errorf("the medium's mode: %w", err)
		}
		mode = qmppolicy.ReadOnly // no medium: never more than read-only
		for _, b := range blocks {
			if hf.Device != "" && (b.QdevID == hf.Device || b.Device == hf.Device) && b.Inserted != nil && !b.Inserted.ReadOnly {
				mode = qmppolicy.ReadWrite
			}
		}
	}
	if mode == qmppolicy.ReadWrite {
		return []int{os.O_RDWR, os.O_RDONLY}, nil
	}
	return []int{os.O_RDONLY}, nil
}

// openFile opens path beneath dir as cred, non-blocking (a FIFO must
// not hang vmsup), checks the object and clears O_NONBLOCK again.
func openFile(dir, path string, flags int, cred storage.Cred) (*os.File, error) {
	f, err := storage.OpenBeneathAs(dir, path, flags|unix.O_NONBLOCK, cred)
	if err != nil {
		return nil, err
	}
	if _, err := storage.CheckDiskObject(f); err != nil {
		f.Close()
		return nil, err
	}
	fl, err := unix.FcntlInt(f.Fd(), unix.F_GETFL, 0)
	if err == nil {
		_, err = unix.FcntlInt(f.Fd(), unix.F_SETFL, fl&^unix.O_NONBLOCK)
	}
	if err != nil {
		f.Close()
		return nil, fmt.Errorf("%s: clear O_NONBLOCK: %w", path, err)
	}
	return f, nil
}

// Execute passes r's descriptors to QEMU, one fd set per file,
// sends d with the sets in the names' place, and removes the sets again if
// the command fails.
func Execute(ctx context.Context, c *qmp.Conn, d *qmppolicy.Decision, r *Files) ([]byte, error) {
	undo := func() {
		for _, id := range r.sets {
			_ = c.RemoveFD(context.WithoutCancel(ctx), id, nil)
		}
	}
	for i, hf := range d.Files {
		var set *int64
		for _, f := range r.files[i] {
			info, err := c.AddFD(ctx, set, "vmsup qmp "+filepath.Base(hf.Path), f)
			if err != nil {
				undo()
				return nil, fmt.Errorf("qmp: pass %s: %w", hf.Field, err)
			}
			if set == nil {
				set = &info.FDSetID
				r.sets = append(r.sets, info.FDSetID)
			}
		}
		hf.Replace(fmt.Sprintf("/dev/fdset/%d", *set))
	}
	cmd, err := d.Encode()
	if err != nil {
		undo()
		return nil, fmt.Errorf("qmp: %s: encode: %w", d.Command.Execute, err)
	}
	reply, err := c.ExecuteRaw(ctx, cmd)
	if err != nil {
		undo()
	}
	return reply, err
}
