package remoteapi

import (
	"fmt"
	"strings"

	"github.com/vmsup/vmsup/units"
)

// UnitOptions say what the API's systemd units run and where they listen.
type UnitOptions struct {
	Self   string // the vmsup binary
	Config string // the server's configuration file
	// Args are vmsup's global flags the server runs with (--root, --qemu,
	// the places VM files may name...), as the command that wrote the
	// units had them: without them the server would manage the defaults
	// (/var/lib/vmsup), not what that command did.
	Args []string
	// Listen is the TCP address for mutual TLS ("0.0.0.0:8443"; "" for
	// none); Socket the unix socket's path ("" for none).
	Listen, Socket string
	// Environment is passed to the server (VMSUP_ROOT=..., the flags'
	// environment variables).
	Environment []string
}

// Unit names.
const (
	SocketUnit  = "vmsup-api.socket"
	ServiceUnit = "vmsup-api.service"
)

// Units are vmsup-api.socket and vmsup-api.service. The socket is
// Accept=no: one short-lived server takes every connection of a burst and
// exits when no call has been in flight for the config's idle_exit; the
// next connection starts it again. (Accept=yes would start one vmsup per
// connection: 200 idle connections would be 200 processes, and the limits
// per client, which count across connections, could not be kept.)
func Units(o UnitOptions) (socket, service string, err error) {
	var listen []string
	if o.Listen != "" {
		listen = append(listen, "ListenStream="+o.Listen)
	}
	if o.Socket != "" {
		listen = append(listen, "ListenStream="+o.Socket, "SocketMode=0666")
	}
	socket = fmt.Sprintf(`[Unit]
Description=vmsup remote API (the server starts on a connection)

[Socket]
%s
Accept=no
# A burst of connections waits here while the server starts.
Backlog=1024

[Install]
WantedBy=sockets.target
`, strings.Join(listen, "\n"))
	argv := append(append([]string{o.Self}, o.Args...), "api", "serve", "--config", o.Config)
	exec, err := units.ExecLine(argv)
	if err != nil {
		return "", "", fmt.Errorf("%s: ExecStart: %w", ServiceUnit, err)
	}
	var env []string
	for _, e := range o.Environment {
		env = append(env, fmt.Sprintf("Environment=%q", e))
	}
	service = fmt.Sprintf(`[Unit]
Description=vmsup remote API (exits when idle)
Requires=%s
After=%s

[Service]
ExecStart=%s
%s
`, SocketUnit, SocketUnit, exec, strings.Join(env, "\n"))
	return socket, service, nil
}
