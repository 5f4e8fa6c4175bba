package main

import (
	"bytes"
	"os"

	"golang.org/x/sys/unix"
)

// topInput reads top's keys from in when it is a terminal: it sets the
// terminal to take keys one at a time, unechoed (Ctrl-C still interrupts),
// and returns a channel closed when q is typed, and restore, which gives
// the terminal its settings back. Not a terminal: nothing is read, and
// only an interrupt ends top.
func topInput(in *os.File) (quit <-chan struct{}, restore func()) {
	q := make(chan struct{})
	fd := int(in.Fd())
	old, err := unix.IoctlGetTermios(fd, unix.TCGETS)
	if err != nil {
		return q, func() {}
	}
	keys := *old
	keys.Lflag &^= unix.ICANON | unix.ECHO
	keys.Cc[unix.VMIN], keys.Cc[unix.VTIME] = 1, 0
	if err := unix.IoctlSetTermios(fd, unix.TCSETS, &keys); err != nil {
		return q, func() {}
	}
	go func() {
		buf := make([]byte, 64)
		for {
			n, err := in.Read(buf)
			if bytes.ContainsAny(buf[:n], "qQ\x03") {
				close(q)
				return
			}
			if err != nil {
				return
			}
		}
	}()
	return q, func() { _ = unix.IoctlSetTermios(fd, unix.TCSETS, old) }
}
