package qmp

import (
	"errors"
	"fmt"
)

// ErrClosed is wrapped by every error caused by the connection being gone:
// closed by Close, or ended by QEMU (EOF, reset, garbage on the stream).
var ErrClosed = errors.New("qmp: connection closed")

// Error is an error reply from QEMU or the guest agent. It keeps QMP's error
// class so callers can branch on it (see IsClass) instead of matching text.
type Error struct {
	// Class is QMP's error class, e.g. "GenericError", "CommandNotFound",
	// "DeviceNotFound", "KVMMissingCap".
	Class string `json:"class"`
	// Desc is QEMU's human-readable description.
	Desc string `json:"desc"`
	// Command is the command that failed; empty if unknown.
	Command string `json:"-"`
}

func (e *Error) Error() string {
	if e.Command == "" {
		return fmt.Sprintf("qmp: %s: %s", e.Class, e.Desc)
	}
	return fmt.Sprintf("qmp: %s: %s: %s", e.Command, e.Class, e.Desc)
}

// Error classes QEMU uses (qapi/error.json).
const (
	ClassGenericError    = "GenericError"
	ClassCommandNotFound = "CommandNotFound"
	ClassDeviceNotActive = "DeviceNotActive"
	ClassDeviceNotFound  = "DeviceNotFound"
	ClassKVMMissingCap   = "KVMMissingCap"
)

// IsClass reports whether err is, or wraps, a QMP *Error of the given class.
func IsClass(err error, class string) bool {
	var e *Error
	return errors.As(err, &e) && e.Class == class
}
