// Package memstate saves a guest's memory and device state (a migration
// stream) into a file vmsup opened, and loads it back, through the
// transport the QEMU at hand offers: QEMU 7.2 takes the file as "fd:"; QEMU
// 9.1 and newer deprecate "fd:" on a file ("Use file: instead"), so where
// QEMU has mapped-ram (9.0, which has "file:" since 8.2) the file goes to an
// fd set and the stream to "file:/dev/fdset/N", with mapped-ram on: RAM at
// fixed offsets, a sparse file, pages written in place.
//
// What the QEMU offers is asked of that QEMU (query-migrate-capabilities),
// as the host probe asks the installed binary (hostcaps records the same
// list): a VM started before an upgrade still runs the older QEMU. A state
// file says itself whether it was written with mapped-ram (QEMU writes the
// capabilities the reader must match into its configuration section), so
// a load needs no record of how it was saved.
package memstate

import (
	"context"
	"errors"
	"fmt"
	"os"
	"slices"
	"time"

	"github.com/vmsup/vmsup/qmp"
)

const (
	// fdName is the state file's descriptor name for "fd:".
	fdName = "vmsup-state"
	// fdsetNote marks the fd set of a state file (query-fdsets), so that a
	// recovery finds one a dead command left.
	fdsetNote = "vmsup memory state"
	// MappedRAM is QEMU's capability for RAM at fixed offsets in a file.
	MappedRAM = "mapped-ram"
)

// Way is how a QEMU takes a state file.
type Way struct {
	File      bool // "file:" (with an fd set) rather than "fd:"
	MappedRAM bool // the mapped-ram capability
}

// WayOf is the way for a QEMU with these migration capabilities: "file:"
// where it has mapped-ram (QEMU 9.0 and newer; "fd:" on a file is
// deprecated from 9.1), else "fd:" as QEMU 7.2 takes it.
func WayOf(caps []string) Way {
	m := slices.Contains(caps, MappedRAM)
	return Way{File: m, MappedRAM: m}
}

// Ask asks the QEMU behind c for its way.
func Ask(ctx context.Context, c *qmp.Conn) (Way, error) {
	caps, err := capabilities(ctx, c)
	if err != nil {
		return Way{}, err
	}
	names := make([]string, 0, len(caps))
	for n := range caps {
		names = append(names, n)
	}
	return WayOf(names), nil
}

func capabilities(ctx context.Context, c *qmp.Conn) (map[string]bool, error) {
	var caps []qmp.MigrationCapability
	if err := c.Execute(ctx, "query-migrate-capabilities", nil, &caps); err != nil {
		return nil, fmt.Errorf("query-migrate-capabilities: %w", err)
	}
	m := make(map[string]bool, len(caps))
	for _, c := range caps {
		m[c.Capability] = c.State
	}
	return m, nil
}

// Save migrates the guest's state into f (open for writing, empty),
// reporting progress if set. The guest is left as the migration leaves it
// (paused, its state saved). mapped-ram is off again after it.
func Save(ctx context.Context, c *qmp.Conn, f *os.File, progress func(done, total int64)) error {
	way, err := Ask(ctx, c)
	if err != nil {
		return err
	}
	if !way.File {
		if err := c.GetFD(ctx, fdName, f); err != nil {
			return err
		}
		if err := c.Migrate(ctx, "fd:"+fdName); err != nil {
			return err
		}
		return Wait(ctx, c, progress)
	}
	defer Reset(context.WithoutCancel(ctx), c)
	if way.MappedRAM {
		// A capability QEMU will not combine with one already on (say
		// postcopy-ram) leaves the stream as it is: "file:" takes it too.
		_ = setMappedRAM(ctx, c, true)
	}
	uri, err := addFD(ctx, c, f)
	if err != nil {
		return err
	}
	if err := c.Migrate(ctx, uri); err != nil {
		return err
	}
	return Wait(ctx, c, progress)
}

// Load reads the state in f (open for reading) into a QEMU started with
// "-incoming defer"; the guest stays paused after it.
func Load(ctx context.Context, c *qmp.Conn, f *os.File) error {
	h, err := ReadHeader(f)
	if err != nil {
		return err
	}
	way, err := Ask(ctx, c)
	if err != nil {
		return err
	}
	if h.MappedRAM() && !way.MappedRAM {
		return errors.New("the memory state was saved with mapped-ram (by QEMU 9.0 or newer), which this QEMU cannot read")
	}
	if !way.File {
		if err := c.GetFD(ctx, fdName, f); err != nil {
			return err
		}
		if err := c.MigrateIncoming(ctx, "fd:"+fdName); err != nil {
			return err
		}
		return Wait(ctx, c, nil)
	}
	defer Reset(context.WithoutCancel(ctx), c)
	// The reader matches the writer: a stream from QEMU 7.2 (no
	// mapped-ram) loads through "file:" as it is.
	if err := setMappedRAM(ctx, c, h.MappedRAM()); err != nil && h.MappedRAM() {
		return err
	}
	uri, err := addFD(ctx, c, f)
	if err != nil {
		return err
	}
	if err := c.MigrateIncoming(ctx, uri); err != nil {
		return err
	}
	return Wait(ctx, c, nil)
}

// Reset undoes what a save or load set up in QEMU, whether it ended or
// its command died: mapped-ram off (a later live migration over a socket
// refuses it) and the state file's fd sets removed. Errors are ignored: a
// QEMU without mapped-ram or fd sets has nothing to undo.
func Reset(ctx context.Context, c *qmp.Conn) {
	if caps, err := capabilities(ctx, c); err == nil && caps[MappedRAM] {
		_ = setMappedRAM(ctx, c, false)
	}
	sets, err := c.QueryFDSets(ctx)
	if err != nil {
		return
	}
	for _, s := range sets {
		if slices.ContainsFunc(s.FDs, func(fd qmp.FDSetFD) bool { return fd.Opaque == fdsetNote }) {
			_ = c.RemoveFD(ctx, s.FDSetID, nil)
		}
	}
}

func setMappedRAM(ctx context.Context, c *qmp.Conn, on bool) error {
	return c.MigrateSetCapabilities(ctx, []qmp.MigrationCapability{{Capability: MappedRAM, State: on}})
}

// addFD passes f into a new fd set and returns the "file:" URI naming it.
func addFD(ctx context.Context, c *qmp.Conn, f *os.File) (string, error) {
	info, err := c.AddFD(ctx, nil, fdsetNote, f)
	if err != nil {
		return "", err
	}
	return fmt.Sprintf("file:/dev/fdset/%d", info.FDSetID), nil
}

// Wait polls a migration into or out of a file until it ends; a cancelled
// ctx cancels the migration.
func Wait(ctx context.Context, c *qmp.Conn, progress func(done, total int64)) error {
	for {
		mi, err := c.QueryMigrate(ctx)
		if err != nil {
			return err
		}
		if progress != nil && mi.RAM != nil {
			progress(mi.RAM.Transferred, mi.RAM.Total)
		}
		switch mi.Status {
		case qmp.MigrationCompleted:
			return nil
		case qmp.MigrationFailed, qmp.MigrationCancelled:
			return fmt.Errorf("migration %s: %s", mi.Status, mi.ErrorDesc)
		}
		select {
		case <-ctx.Done():
			_ = c.MigrateCancel(context.WithoutCancel(ctx))
			return ctx.Err()
		case <-time.After(20 * time.Millisecond):
		}
	}
}
