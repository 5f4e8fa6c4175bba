package qmp

import (
	"context"
	"errors"
	"fmt"
	"os"

	"golang.org/x/sys/unix"
)

// FDInfo is add-fd's reply: the fd set the descriptor went into and its
// number inside QEMU. QEMU opens it as /dev/fdset/FDSetID.
type FDInfo struct {
	FDSetID int64 `json:"fdset-id"`
	FD      int64 `json:"fd"`
}

// FDSet is one entry of query-fdsets.
type FDSet struct {
	FDSetID int64     `json:"fdset-id"`
	FDs     []FDSetFD `json:"fds"`
}

// FDSetFD is a descriptor inside an FDSet.
type FDSetFD struct {
	FD     int64  `json:"fd"`
	Opaque string `json:"opaque,omitempty"`
}

// GetFD passes f to QEMU under name (getfd), for commands that take an fd
// name, e.g. netdev_add's "fd". The caller may close f afterwards: QEMU has
// its own copy.
func (c *Conn) GetFD(ctx context.Context, name string, f *os.File) error {
	args := struct {
		FDName string `json:"fdname"`
	}{name}
	return c.executeFD(ctx, "getfd", args, nil, f)
}

// CloseFD closes the descriptor QEMU received under name (closefd).
func (c *Conn) CloseFD(ctx context.Context, name string) error {
	args := struct {
		FDName string `json:"fdname"`
	}{name}
	return c.Execute(ctx, "closefd", args, nil)
}

// AddFD passes f to QEMU into an fd set (add-fd): into set *fdsetID, or a
// new set if fdsetID is nil. opaque is a free-form note shown by
// query-fdsets. QEMU can then open the file as /dev/fdset/N.
func (c *Conn) AddFD(ctx context.Context, fdsetID *int64, opaque string, f *os.File) (FDInfo, error) {
	args := struct {
		FDSetID *int64 `json:"fdset-id,omitempty"`
		Opaque  string `json:"opaque,omitempty"`
	}{fdsetID, opaque}
	var info FDInfo
	err := c.executeFD(ctx, "add-fd", args, &info, f)
	return info, err
}

// RemoveFD removes descriptor fd from fd set fdsetID, or the whole set if fd
// is nil (remove-fd). QEMU closes it once nothing uses it.
func (c *Conn) RemoveFD(ctx context.Context, fdsetID int64, fd *int64) error {
	args := struct {
		FDSetID int64  `json:"fdset-id"`
		FD      *int64 `json:"fd,omitempty"`
	}{fdsetID, fd}
	return c.Execute(ctx, "remove-fd", args, nil)
}

// QueryFDSets lists QEMU's fd sets (query-fdsets).
func (c *Conn) QueryFDSets(ctx context.Context) ([]FDSet, error) {
	var sets []FDSet
	err := c.Execute(ctx, "query-fdsets", nil, &sets)
	return sets, err
}

// executeFD runs a command carrying f as SCM_RIGHTS. QEMU holds one received
// descriptor per monitor until a getfd/add-fd consumes it, so these commands
// run one at a time.
func (c *Conn) executeFD(ctx context.Context, command string, args, result any, f *os.File) error {
	if f == nil {
		return fmt.Errorf("qmp: %s: nil file", command)
	}
	c.fdmu.Lock()
	defer c.fdmu.Unlock()
	return c.execute(ctx, command, args, result, f)
}

// writeWithFD sends the start of payload with f's descriptor attached and
// returns how many bytes went out. It uses SyscallConn rather than f.Fd so
// f keeps its non-blocking mode. Called with wmu held.
func (c *Conn) writeWithFD(payload []byte, f *os.File) (int, error) {
	rc, err := f.SyscallConn()
	if err != nil {
		return 0, fmt.Errorf("file %s: %w", f.Name(), err)
	}
	var n int
	var werr error
	cerr := rc.Control(func(fd uintptr) {
		n, _, werr = c.uc.WriteMsgUnix(payload, unix.UnixRights(int(fd)), nil)
	})
	if err := errors.Join(cerr, werr); err != nil {
		return n, err
	}
	return n, nil
}
