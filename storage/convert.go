package storage

import (
	"context"
	"fmt"
	"os"
	"syscall"
)

// Convert copies image src (its whole backing chain, as the guest reads
// it) into dst in format dstFormat (qemu-img convert). With existing, dst
// is an image already made at the right size and zero-initialized (a new
// qcow2); otherwise dst must not exist and is created owner-only. srcFormat
// "" lets qemu-img probe. Bounded by ctx only.
func (t Tools) Convert(ctx context.Context, src, srcFormat, dst, dstFormat string, existing bool) error {
	args := []string{"convert", "-q"}
	if srcFormat != "" {
		args = append(args, "-f", srcFormat)
	}
	args = append(args, "-O", dstFormat)
	if existing {
		args = append(args, "-n", "--target-is-zero")
	} else {
		// Made here first, owner-only and never over another file:
		// qemu-img keeps the mode of a file that exists.
		f, err := os.OpenFile(dst, os.O_CREATE|os.O_EXCL|os.O_WRONLY|syscall.O_CLOEXEC, 0o600)
		if err != nil {
			return fmt.Errorf("create %s: %w", dst, err)
		}
		f.Close()
	}
	if err := t.long(ctx, append(args, src, dst)...); err != nil {
		if !existing {
			os.Remove(dst)
		}
		return err
	}
	return nil
}
