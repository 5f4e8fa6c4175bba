// Package vncproxytest is a stand-in for a VM's VNC (or console) socket,
// for tests of what carries a session: it greets as a VNC server and
// echoes what it reads.
package vncproxytest

import (
	"io"
	"net"
	"path/filepath"
	"testing"
)

// Greeting is what the stand-in sends first, as QEMU's VNC server does.
const Greeting = "RFB 003.008\n"

// Socket listens on a unix socket in a temporary directory of t until t
// ends; each connection gets Greeting, then its own bytes back. It
// returns the socket's path.
func Socket(t testing.TB) string {
	t.Helper()
	sock := filepath.Join(t.TempDir(), "vnc.sock")
	ln, err := net.Listen("unix", sock)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { ln.Close() })
	go func() {
		for {
			c, err := ln.Accept()
			if err != nil {
				return
			}
			go func() {
				defer c.Close()
				c.Write([]byte(Greeting))
				io.Copy(c, c)
			}()
		}
	}()
	return sock
}
