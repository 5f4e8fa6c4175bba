package storage

import (
	"fmt"
	"strings"
)

// Error is a problem with one disk. Its text is one line:
// `disk "data": backing file /img/base.qcow2 (of /img/vm1.qcow2): no such file`.
type Error struct {
	Disk  string
	Field string // the disk's key at fault ("file", "backing", "size"), or ""
	Msg   string
	Err   error // the underlying error, if any
}

func (e *Error) Error() string { return fmt.Sprintf("disk %q: %s", e.Disk, oneLine(e.Msg)) }
func (e *Error) Unwrap() error { return e.Err }

func diskErr(disk, field string, err error, format string, args ...any) *Error {
	return &Error{Disk: disk, Field: field, Msg: fmt.Sprintf(format, args...), Err: err}
}

// oneLine keeps the last meaningful line of a tool's message: qemu-img and
// librados print context first and the cause last.
func oneLine(s string) string {
	s = strings.TrimSpace(s)
	if i := strings.LastIndexByte(s, '\n'); i >= 0 {
		s = strings.TrimSpace(s[i+1:])
	}
	return s
}
