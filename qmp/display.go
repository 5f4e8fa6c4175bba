package qmp

import "context"

// The graphical console's commands (QEMU 7.2).

// Screendump writes the guest's screen (of the display device when device
// is set, else the primary one) to filename as a binary PPM. QEMU opens the
// file itself, as its own user.
func (c *Conn) Screendump(ctx context.Context, filename, device string) error {
	args := map[string]any{"filename": filename}
	if device != "" {
		args["device"] = device
	}
	return c.Execute(ctx, "screendump", args, nil)
}

// SetVNCPassword sets the VNC server's password (QEMU takes 8 bytes of
// it, the VNC protocol's limit). Clients already connected stay.
func (c *Conn) SetVNCPassword(ctx context.Context, password string) error {
	return c.Execute(ctx, "set_password", map[string]any{"protocol": "vnc", "password": password}, nil)
}

// ExpireVNCPassword makes the VNC password expire at when: "now",
// "never", "+SECONDS" or a UNIX time. Clients already connected stay.
func (c *Conn) ExpireVNCPassword(ctx context.Context, when string) error {
	return c.Execute(ctx, "expire_password", map[string]any{"protocol": "vnc", "time": when}, nil)
}

// VNCInfo is the part of query-vnc's reply vmsup reads.
type VNCInfo struct {
	Enabled bool   `json:"enabled"`
	Family  string `json:"family,omitempty"`  // "unix" for vmsup's socket
	Service string `json:"service,omitempty"` // the socket's path
	Auth    string `json:"auth,omitempty"`    // "none" or "vnc" (a password)
	Clients []struct {
		Host    string `json:"host"`
		Service string `json:"service"`
	} `json:"clients,omitempty"`
}

// QueryVNC returns the VNC server's state.
func (c *Conn) QueryVNC(ctx context.Context) (VNCInfo, error) {
	var v VNCInfo
	err := c.Execute(ctx, "query-vnc", nil, &v)
	return v, err
}
