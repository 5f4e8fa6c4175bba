package main

import (
	"context"
	"errors"
	"fmt"
	"image/png"
	"net"
	"os"
	"path/filepath"
	"time"

	"github.com/google/renameio/v2"
	"github.com/spf13/cobra"

	"github.com/vmsup/vmsup/internal/console/vncproxy"
	"github.com/vmsup/vmsup/internal/util/atomicfile"
	"github.com/vmsup/vmsup/internal/vm/vmerr"
	"github.com/vmsup/vmsup/remoteapi"
	"github.com/vmsup/vmsup/supervisor"
)

// defaultConsoleWait is how long vmsup vnc and console --web wait for
// their client (and a VNC password stays valid).
const defaultConsoleWait = 2 * time.Minute

func screenshotCmd(g *globals) *cobra.Command {
	return &cobra.Command{
		Use:   "screenshot NAME FILE.png",
		Short: "Save the VM's screen as a PNG (QMP screendump; needs [display])",
		Long: "Save what the VM's video device shows now as a PNG file: QEMU writes the screen into the VM's\n" +
			"state directory, vmsup reads it back, converts it and removes it.",
		Args: cobra.ExactArgs(2),
		RunE: func(cmd *cobra.Command, args []string) error {
			return g.withVM(args[0], func(sup *supervisor.Supervisor, name string) error {
				img, err := sup.Screenshot(cmd.Context(), name)
				if err != nil {
					return err
				}
				out, err := atomicfile.NewPendingFile(args[1], renameio.WithPermissions(0o644))
				if err != nil {
					return fmt.Errorf("%s: %w", args[1], err)
				}
				defer out.Cleanup()
				if err := png.Encode(out, img); err != nil {
					return fmt.Errorf("%s: %w", args[1], err)
				}
				if err := out.CloseAtomicallyReplace(); err != nil {
					return fmt.Errorf("%s: %w", args[1], err)
				}
				b := img.Bounds()
				g.out.action(actionJSON{Name: name, Action: "screenshot", Note: args[1]},
					fmt.Sprintf("%s: %dx%d screen saved to %s", name, b.Dx(), b.Dy(), args[1]))
				return nil
			})
		},
	}
}

// listenFlags are --listen and --listen-public of vnc and console --web.
type listenFlags struct {
	addr   string
	public bool
}

func (l *listenFlags) add(c *cobra.Command, what string) {
	c.Flags().StringVar(&l.addr, "listen", "127.0.0.1:0", what+"address to listen on (port 0: any free one); loopback unless --listen-public")
	c.Flags().BoolVar(&l.public, "listen-public", false, what+"allow a --listen address other hosts can reach (a warning says how the session is protected)")
}

// check refuses a non-loopback address without --listen-public (exit 2).
func (l *listenFlags) check() error {
	if err := vncproxy.CheckListen(l.addr, l.public); err != nil {
		return usageError{err}
	}
	return nil
}

// warnPublic says on stderr that a session on a non-loopback address is
// reachable from the network, and what protects it.
func (l *listenFlags) warnPublic(cmd *cobra.Command, addr net.Addr, name, guard string) {
	host, _, _ := net.SplitHostPort(l.addr)
	if vncproxy.Loopback(host) {
		return
	}
	fmt.Fprintf(cmd.ErrOrStderr(), "vmsup %s: warning: listening on %s, reachable from the network: %s VM %q's screen; "+
		"the connection is not encrypted (no TLS): use a trusted network or an ssh tunnel to a loopback port\n", cmd.Name(), addr, guard, name)
}

func vncCmd(g *globals) *cobra.Command {
	var listen listenFlags
	var wait time.Duration
	c := &cobra.Command{
		Use:   "vnc NAME",
		Short: "Hand a VNC client the VM's screen for one session, on a loopback port",
		Long: "Listen on a loopback port (or --listen ADDR), print it, and connect the first VNC client that\n" +
			"comes within --timeout to the VM's VNC server (its unix socket); the port closes as soon as the\n" +
			"client connects, and vmsup vnc ends when the client leaves. With display.password the VNC server\n" +
			"asks for the one-time password printed, valid until --timeout. With --remote, the port is on this\n" +
			"machine and the session goes to the remote host's API as a websocket (role operator).",
		Args: cobra.ExactArgs(1),
		RunE: func(cmd *cobra.Command, args []string) error {
			if g.json {
				return usageError{errors.New("vnc is interactive: it has no --json form")}
			}
			if err := listen.check(); err != nil {
				return err
			}
			return g.opsVM(args[0], func(sup remoteapi.Ops, name string) error {
				pw, ln, err := consoleListen(cmd.Context(), sup, name, listen.addr, wait)
				if err != nil {
					return err
				}
				guard := "the first VNC client to connect gets"
				if pw != "" {
					guard = "the first VNC client to connect with the one-time password (display.password) gets"
				}
				listen.warnPublic(cmd, ln.Addr(), name, guard)
				fmt.Fprintf(cmd.OutOrStdout(), "vnc://%s\n", ln.Addr())
				if pw != "" {
					fmt.Fprintf(cmd.OutOrStdout(), "password: %s (valid for %s)\n", pw, wait)
				}
				return vmerr.Wrap(name, vncproxy.ServeOne(cmd.Context(), ln, wait, dialer(g, sup, name)))
			})
		},
	}
	listen.add(c, "")
	c.Flags().DurationVar(&wait, "timeout", defaultConsoleWait, "how long to wait for the client")
	return c
}

// webConsole serves noVNC for one browser session (console --web).
func webConsole(cmd *cobra.Command, g *globals, sup remoteapi.Ops, name string, listen listenFlags, wait time.Duration) error {
	if _, err := os.Stat(filepath.Join(vncproxy.NoVNCDir, "vnc.html")); err != nil {
		return fmt.Errorf("console --web: %w", vncproxy.ErrNoNoVNC)
	}
	pw, ln, err := consoleListen(cmd.Context(), sup, name, listen.addr, wait)
	if err != nil {
		return err
	}
	tok, err := vncproxy.NewToken()
	if err != nil {
		ln.Close()
		return err
	}
	w := &vncproxy.Web{Token: tok, Wait: wait, Password: pw, Dial: dialer(g, sup, name)}
	listen.warnPublic(cmd, ln.Addr(), name, "anyone with the URL's one-time token (128 random bits, valid once and for --timeout) gets")
	fmt.Fprintln(cmd.OutOrStdout(), w.URL(ln.Addr().String()))
	return vmerr.Wrap(name, w.Serve(cmd.Context(), ln))
}

// consoleListen checks the VM serves VNC, makes its one-time password
// if it asks for one, and listens for the client.
func consoleListen(ctx context.Context, sup remoteapi.Ops, name, listen string, wait time.Duration) (string, net.Listener, error) {
	pw, err := sup.VNCTicket(ctx, name, wait)
	if err != nil {
		return "", nil, err
	}
	ln, err := net.Listen("tcp", listen)
	if err != nil {
		return "", nil, fmt.Errorf("--listen %s: %w", listen, err)
	}
	return pw, ln, nil
}

func dialer(g *globals, sup remoteapi.Ops, name string) vncproxy.Dialer {
	return func(ctx context.Context) (net.Conn, error) {
		dctx, cancel := context.WithTimeout(ctx, g.dialTimeout(5*time.Second))
		defer cancel()
		return sup.DialVNC(dctx, name)
	}
}
