package main

import (
	"fmt"
	"os"
	"strings"
	"time"

	"github.com/spf13/cobra"

	"github.com/vmsup/vmsup/remoteapi"
	"github.com/vmsup/vmsup/remoteapi/client"
	"github.com/vmsup/vmsup/spec"
	"github.com/vmsup/vmsup/supervisor"
)

// remoteFlags are the global flags that send a command to a remote host's
// API (docs/remote-api.md) instead of running it here.
type remoteFlags struct {
	url, ca, cert, key string
	cmdPath            string // the command running, for "not remotely" errors
}

func addRemoteFlags(root *cobra.Command, g *globals) {
	pf := root.PersistentFlags()
	pf.StringVar(&g.rem.url, "remote", os.Getenv("VMSUP_REMOTE"), "run the command on a remote host's API: https://HOST:PORT (mutual TLS), unix:///PATH, or a name vmsup remote add stored (env VMSUP_REMOTE)")
	pf.StringVar(&g.rem.ca, "ca", os.Getenv("VMSUP_REMOTE_CA"), "with --remote https: the CA of the server's certificate (PEM; env VMSUP_REMOTE_CA)")
	pf.StringVar(&g.rem.cert, "cert", os.Getenv("VMSUP_REMOTE_CERT"), "with --remote https: this client's certificate (PEM; env VMSUP_REMOTE_CERT)")
	pf.StringVar(&g.rem.key, "key", os.Getenv("VMSUP_REMOTE_KEY"), "with --remote https: this client's key (PEM; env VMSUP_REMOTE_KEY)")
}

// notRemote is the error of a command that runs only on the VMs' host.
func (g *globals) notRemote() error {
	return usageError{fmt.Errorf("%s: not available with --remote (it runs on the VMs' host; docs/remote-api.md lists the commands that do)", g.rem.cmdPath)}
}

// ops runs fn with the operations of the command: the supervisor made from
// the flags, or with --remote the API client.
func (g *globals) ops(fn func(remoteapi.Ops) error) error {
	if g.rem.url == "" {
		return g.with(func(sup *supervisor.Supervisor) error { return fn(sup) })
	}
	if err := g.rem.resolve(); err != nil {
		return usageError{err}
	}
	c, err := client.New(client.Options{URL: g.rem.url, CA: g.rem.ca, Cert: g.rem.cert, Key: g.rem.key})
	if err != nil {
		return usageError{err}
	}
	defer c.Close()
	return fn(c)
}

// opsVM is ops for a command on one VM, given by name or by its file.
func (g *globals) opsVM(arg string, fn func(ops remoteapi.Ops, name string) error) error {
	name, err := vmName(arg)
	if err != nil {
		return err
	}
	return g.ops(func(ops remoteapi.Ops) error { return fn(ops, name) })
}

// opsFiles is ops for a command on VM files, each parsed first (remotely,
// a name does not stand for its file: files are sent by content).
func (g *globals) opsFiles(paths []string, fn func(remoteapi.Ops, []*spec.File) error) error {
	return g.ops(func(ops remoteapi.Ops) error {
		sup, _ := ops.(*supervisor.Supervisor)
		fs, err := loadFiles(sup, paths)
		if err != nil {
			return err
		}
		return fn(ops, fs)
	})
}

// dialTimeout is local for a connection to a VM's socket on this host;
// with --remote, the API's handshake (and the server's start by its
// socket) comes first: 30 s.
func (g *globals) dialTimeout(local time.Duration) time.Duration {
	if g.rem.url != "" {
		return 30 * time.Second
	}
	return local
}

// remoteCommands are the commands --remote runs on the remote host; the
// others are refused with it rather than run here.
var remoteCommands = map[string]bool{
	"ls": true, "status": true, "up": true, "plan": true, "apply": true, "down": true, "kill": true,
	"restart": true, "reboot": true, "reset": true, "pause": true, "resume": true, "stats": true, "top": true,
	"events": true, "logs": true, "exec": true, "console": true, "vnc": true,
	"backup": true, "migrate": true,
	"snapshot create": true, "snapshot ls": true, "snapshot revert": true, "snapshot rm": true,
}

// checkRemote refuses --remote for a command that does not run remotely.
func (g *globals) checkRemote() error {
	if g.rem.url == "" {
		return nil
	}
	if !remoteCommands[strings.TrimPrefix(g.rem.cmdPath, "vmsup ")] {
		return g.notRemote()
	}
	return nil
}
