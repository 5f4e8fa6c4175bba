package main

import (
	"context"
	"errors"
	"fmt"
	"io"
	"net"
	"os"
	"time"

	"github.com/spf13/cobra"
	"golang.org/x/term"

	"github.com/vmsup/vmsup/remoteapi"
)

// detachKey is Ctrl-] (as telnet and virsh console use).
const detachKey = 0x1d

func consoleCmd(g *globals) *cobra.Command {
	var web bool
	var listen listenFlags
	var wait time.Duration
	c := &cobra.Command{
		Use:   "console NAME",
		Short: "Attach to the VM's serial console (detach with Ctrl-]), or its screen in a browser (--web)",
		Long: "Attach to the VM's serial console socket. On a terminal, Ctrl-] detaches and leaves the VM running.\n" +
			"With --remote, the console comes through the API as a websocket (role operator), the same way.\n" +
			"Without a terminal, stdin is sent to the console until it ends, and console output is copied to stdout.\n\n" +
			"With --web (a VM with [display]): serve noVNC (Debian's novnc package) on a loopback port for one\n" +
			"browser session and print its URL, which holds a one-time token; the token works once, until\n" +
			"--timeout, and vmsup ends (nothing listens any more) when the browser leaves.",
		Args: cobra.ExactArgs(1),
		RunE: func(cmd *cobra.Command, args []string) error {
			if g.json {
				return usageError{fmt.Errorf("console is interactive: it has no --json form")}
			}
			if web {
				if err := listen.check(); err != nil {
					return err
				}
			}
			return g.opsVM(args[0], func(sup remoteapi.Ops, name string) error {
				if web {
					return webConsole(cmd, g, sup, name, listen, wait)
				}
				dctx, cancel := context.WithTimeout(cmd.Context(), g.dialTimeout(3*time.Second))
				conn, err := sup.DialConsole(dctx, name)
				cancel()
				if err != nil {
					return consoleDialErr(err)
				}
				defer conn.Close()
				return attach(cmd.Context(), conn, os.Stdin, cmd.OutOrStdout())
			})
		},
	}
	c.Flags().BoolVar(&web, "web", false, "serve the VM's screen to a browser (noVNC) for one session")
	listen.add(c, "with --web: ")
	c.Flags().DurationVar(&wait, "timeout", defaultConsoleWait, "with --web: how long the token waits for the browser")
	return c
}

// consoleDialErr is a failed dial's error with the hint a local one
// gets; a remote refusal (forbidden, unauthorized, too-many) is the
// server's word as it is.
func consoleDialErr(err error) error {
	var re *remoteapi.Error
	if errors.As(err, &re) && re.Kind != remoteapi.KindNotRunning && re.Kind != remoteapi.KindNotFound && re.Kind != remoteapi.KindFailed {
		return err
	}
	return fmt.Errorf("%w (is it running?)", err)
}

func attach(ctx context.Context, conn net.Conn, in *os.File, out io.Writer) error {
	fd := int(in.Fd())
	isTTY := term.IsTerminal(fd)
	if isTTY {
		old, err := term.MakeRaw(fd)
		if err != nil {
			return err
		}
		defer term.Restore(fd, old)
		fmt.Fprint(out, "Connected to the console; Ctrl-] detaches.\r\n")
	}
	done := make(chan error, 2)
	go func() {
		_, err := io.Copy(out, conn)
		done <- err
	}()
	go func() {
		buf := make([]byte, 1024)
		for {
			n, err := in.Read(buf)
			for i := 0; i < n; i++ {
				if isTTY && buf[i] == detachKey {
					_, _ = conn.Write(buf[:i])
					done <- nil
					return
				}
			}
			if n > 0 {
				if _, werr := conn.Write(buf[:n]); werr != nil {
					done <- werr
					return
				}
			}
			if err != nil {
				// stdin ended: give the guest a moment to answer, then leave.
				time.Sleep(500 * time.Millisecond)
				done <- nil
				return
			}
		}
	}()
	select {
	case err := <-done:
		if isTTY {
			fmt.Fprint(out, "\r\nDetached.\r\n")
		}
		return err
	case <-ctx.Done():
		return nil
	}
}
