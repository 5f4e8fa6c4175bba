package qmppolicy

// The graphical console's commands as vmsup's own operations send them:
// vmsup screenshot (screendump into the state directory) and the one-time
// VNC password of vmsup vnc and console --web.

// checkScreendump: the file QEMU writes must be in the state directory.
func checkScreendump(c *call) error {
	f, ok := str(c.args, "filename")
	if !ok {
		return c.refuse(Form, "no filename")
	}
	return c.path("filename", f)
}

// checkVNCPassword: only VNC's password (SPICE has none here).
func checkVNCPassword(c *call) error {
	if p, _ := str(c.args, "protocol"); p != "vnc" {
		return c.refuse(Form, "protocol %q: only \"vnc\" (vmsup runs no SPICE server)", short(p))
	}
	return nil
}
