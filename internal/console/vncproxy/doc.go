// Package vncproxy hands a VM's VNC server (a unix socket only root can
// reach, see package display) to one client for one session: a VNC
// client on a loopback port (ServeOne), or a browser running noVNC over a
// websocket, reached with a one-time token (Web). Each serves one session
// and returns: nothing listens before a user asks for a console, or after
// the session ends or its wait runs out. It knows nothing of VMs: the
// caller gives it a Dialer for the VM's socket.
package vncproxy
