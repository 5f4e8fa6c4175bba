package units

import (
	"strconv"
	"syscall"

	"golang.org/x/sys/unix"
)

func unixSignalName(s syscall.Signal) string {
	if n := unix.SignalName(s); n != "" {
		return n
	}
	return "signal " + strconv.Itoa(int(s))
}
