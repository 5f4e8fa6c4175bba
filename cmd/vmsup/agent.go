package main

import (
	"bufio"
	"context"
	"errors"
	"fmt"
	"log/slog"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"runtime"
	"strconv"
	"strings"
	"time"

	"github.com/spf13/cobra"

	"github.com/vmsup/vmsup/fleet"
	"github.com/vmsup/vmsup/fleet/guard"
	"github.com/vmsup/vmsup/internal/observe/iohealth"
	"github.com/vmsup/vmsup/spec"
	"github.com/vmsup/vmsup/supervisor"
	"github.com/vmsup/vmsup/units"
)

// agentCmd is the fleet's per-host process; run it as a systemd service
// (Restart=always): its restarts never touch the VMs.
func agentCmd(g *globals) *cobra.Command {
	e := &etcdFlags{}
	var host, memory, address, transport string
	var labels []string
	var cpus, port int
	var ttl, margin, stallAfter, failoverStalled time.Duration
	var failover, guarded bool
	c := &cobra.Command{
		Use:   "agent",
		Short: "Run this host's part of the fleet: keep its VMs as etcd says, report them, schedule when elected",
		Args:  cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			h, err := agentHost(host, memory, cpus, labels)
			if err != nil {
				return err
			}
			h.Migration = fleet.Endpoint{Address: address, Transport: strings.Fields(transport)}
			// The watchdog may wait up to 1 s past the fence point for
			// answers, the guard fires 0.25 s after that: the margin must
			// leave the guard's kill time before the lease can lapse.
			if ttl < 3*time.Second || margin < 2*time.Second || margin >= ttl {
				return usageError{fmt.Errorf("--ttl %s, --self-fence-margin %s: want a TTL of at least 3s and a margin from 2s to less than the TTL", ttl, margin)}
			}
			if port != 0 && (address == "" || e.ca == "" || e.cert == "") {
				return usageError{errors.New("--migration-port needs --migration-address and the fleet's TLS files (--etcd-ca, --etcd-cert, --etcd-key): the port takes only fleet hosts")}
			}
			log := slog.New(slog.NewTextHandler(os.Stderr, nil))
			return e.with(func(s *fleet.Store) error {
				return g.with(func(sup *supervisor.Supervisor) error {
					a := &fleet.Agent{Store: s, Sup: sup, Host: h, State: filepath.Join(g.root, "fleet"), TTL: ttl, SelfFenceMargin: margin,
						StallAfter: stallAfter, FailoverStalled: failoverStalled, Log: log, Images: g.imageStore()}
					if failover {
						if _, err := exec.LookPath("rbd"); err != nil {
							return fmt.Errorf("--failover needs the Ceph tools (rbd, ceph) to fence lost hosts: %w (or --failover=false)", err)
						}
						a.Fence = &fleet.CephFencer{History: func(vm, image, owner string) {
							log.Warn("fenced", "vm", vm, "image", image, "owner", owner)
						}}
					}
					if guarded {
						m, err := agentGuard(cmd.Context(), g.bus, a, log)
						if err != nil {
							return err
						}
						defer m.Close()
					}
					if port != 0 {
						srv, cli, err := fleet.PeerTLS(e.ca, e.cert, e.key)
						if err != nil {
							return err
						}
						l, err := net.Listen("tcp", net.JoinHostPort(address, strconv.Itoa(port)))
						if err != nil {
							return fmt.Errorf("--migration-port: %w", err)
						}
						a.Host.Migration.Receiver = l.Addr().String()
						a.Listener, a.ServerTLS, a.ClientTLS = l, srv, cli
					}
					self, err := os.Executable()
					if err != nil {
						return err
					}
					a.Connect = func(receiver string) []string {
						return []string{self, "fleet", "migrate-connect", "--etcd-ca", e.ca, "--etcd-cert", e.cert, "--etcd-key", e.key, receiver}
					}
					return a.Run(cmd.Context())
				})
			})
		},
	}
	e.add(c)
	f := c.Flags()
	hostname, _ := os.Hostname()
	f.StringVar(&host, "host", envOr("VMSUP_HOST", hostname), "this host's name in the fleet (env VMSUP_HOST)")
	f.StringSliceVar(&labels, "labels", nil, "this host's labels, KEY=VALUE,... (a VM's [placement] labels must all match)")
	f.IntVar(&cpus, "cpus", 0, "vCPUs this host offers to fleet VMs; default its CPU count (no overcommit)")
	f.StringVar(&memory, "memory", "", "memory this host offers to fleet VMs; default all but 1G")
	f.StringVar(&address, "migration-address", "", "the address other hosts' QEMUs send a migration's stream to")
	f.StringVar(&transport, "migration-transport", "", "the command, split at spaces, that runs `vmsup migrate-receive` on this host from another (default: ssh HOST vmsup migrate-receive)")
	f.IntVar(&port, "migration-port", 0, "listen on --migration-address:PORT for other agents' migrations (mutual TLS with the etcd certificates); 0: use --migration-transport")
	f.BoolVar(&failover, "failover", true, "when elected scheduler, restart a lost host's VMs elsewhere (those with only RBD disks), after fencing it on Ceph")
	f.DurationVar(&ttl, "ttl", 10*time.Second, "the host's lease: other hosts take its VMs over (after fencing) when it lapses")
	f.DurationVar(&margin, "self-fence-margin", 3*time.Second, "an agent that has not renewed its lease for TTL minus this kills its VMs (unless no scheduler can act: docs/fleet.md)")
	f.BoolVar(&guarded, "guard", true, "arm a systemd timer, moved at each renewal, that kills this host's fleet VMs 1.25s after the fence point if the agent did not (frozen, crashed, stopped)")
	f.DurationVar(&stallAfter, "io-stall-after", iohealth.DefaultBound, "a VM whose disk requests stay in flight this long with none ending is reported degraded")
	f.DurationVar(&failoverStalled, "failover-stalled", 0, "when elected scheduler, restart elsewhere (after fencing its host on Ceph) a VM reported degraded by stalled disk I/O for this long; 0: only report it")
	return c
}

// agentGuard gives the agent its guard, on the systemd that runs the VMs;
// close the connection after.
func agentGuard(ctx context.Context, bus string, a *fleet.Agent, log *slog.Logger) (*units.Manager, error) {
	systemctl, err := exec.LookPath("systemctl")
	if err != nil {
		return nil, fmt.Errorf("--guard needs systemctl: %w (or --guard=false)", err)
	}
	m, err := units.Connect(ctx, bus)
	if err != nil {
		return nil, fmt.Errorf("--guard: %w", err)
	}
	a.Guard = &guard.Guard{SD: m.DBus(), Prefix: "vmsup-fleet-guard", Systemctl: systemctl, Log: log}
	return m, nil
}

// agentHost is what the agent registers: the flags, or the host's own
// CPU count and memory.
func agentHost(name, memory string, cpus int, labels []string) (fleet.Host, error) {
	if err := spec.ValidName(name); err != nil {
		return fleet.Host{}, usageError{fmt.Errorf("--host %q: %v", name, err)}
	}
	h := fleet.Host{Name: name, CPUs: cpus, Labels: map[string]string{}}
	if h.CPUs <= 0 {
		h.CPUs = runtime.NumCPU()
	}
	if memory != "" {
		m, err := spec.ParseSize(memory)
		if err != nil {
			return h, usageError{fmt.Errorf("--memory: %v", err)}
		}
		h.Memory = int64(m)
	} else {
		total, err := memTotal()
		if err != nil {
			return h, err
		}
		h.Memory = max(total-1<<30, 0)
	}
	for _, l := range labels {
		k, v, ok := strings.Cut(l, "=")
		if !ok || spec.ValidLabel(k) != nil || spec.ValidLabel(v) != nil {
			return h, usageError{fmt.Errorf("--labels %q: want KEY=VALUE, each 1-63 of [A-Za-z0-9_./-]", l)}
		}
		h.Labels[k] = v
	}
	return h, nil
}

func memTotal() (int64, error) {
	f, err := os.Open("/proc/meminfo")
	if err != nil {
		return 0, err
	}
	defer f.Close()
	sc := bufio.NewScanner(f)
	for sc.Scan() {
		var kb int64
		if n, _ := fmt.Sscanf(sc.Text(), "MemTotal: %d kB", &kb); n == 1 {
			return kb << 10, nil
		}
	}
	return 0, fmt.Errorf("/proc/meminfo: no MemTotal")
}
