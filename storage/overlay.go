package storage

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"os/exec"
	"strings"
)

// External snapshots: a qcow2 overlay on the image a disk runs on, and the
// offline merges that remove one (a running VM merges with QEMU's block
// jobs instead).

// CreateOverlay makes a new qcow2 overlay at path on backing, size bytes,
// without opening backing (-u): a running QEMU holds its write lock, and
// the size is known. The file is made owner-only and never over another.
func (t Tools) CreateOverlay(ctx context.Context, path, backing, backingFormat string, size int64) error {
	return createAtomic(path, func(part string) error {
		if _, err := t.run(ctx, false, "create", "-q", "-f", "qcow2", "-u", "-b", backing, "-F", backingFormat, part, fmt.Sprint(size)); err != nil {
			return fmt.Errorf("create overlay %s: %w", path, err)
		}
		return nil
	})
}

// Commit writes the overlay image's data into its backing file (qemu-img
// commit), for a VM that is not running. It takes as long as the data
// takes: bounded by ctx only.
func (t Tools) Commit(ctx context.Context, image string) error {
	return t.long(ctx, "commit", "-q", "-f", "qcow2", image)
}

// Rebase points image at a new backing file without copying (qemu-img
// rebase -u): for when the new backing reads the same as the old one.
func (t Tools) Rebase(ctx context.Context, image, backing, backingFormat string) error {
	return t.long(ctx, "rebase", "-q", "-u", "-f", "qcow2", "-b", backing, "-F", backingFormat, image)
}

// long runs a qemu-img command that may take a while (its data), with ctx
// as its only bound.
func (t Tools) long(ctx context.Context, args ...string) error {
	cmd := exec.CommandContext(ctx, t.qemuImg(), args...)
	var buf bytes.Buffer
	cmd.Stdout, cmd.Stderr = &buf, &buf
	err := runTied(cmd)
	out := buf.Bytes()
	if err != nil {
		msg := strings.TrimPrefix(oneLine(string(out)), "qemu-img: ")
		if msg == "" {
			msg = err.Error()
		}
		if strings.Contains(string(out), "lock") {
			return fmt.Errorf("qemu-img %s: %w: %s", args[0], ErrInUse, msg)
		}
		return errors.New("qemu-img " + args[0] + ": " + msg)
	}
	return nil
}
