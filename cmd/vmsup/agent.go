package main

import (
	"bufio"
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
	"github.com/vmsup/vmsup/spec"
	"github.com/vmsup/vmsup/supervisor"
)

// agentCmd is the fleet's per-host process; run it as a systemd service
// (Restart=always): its restarts never touch the VMs.
func agentCmd(g *globals) *cobra.Command {
	e := &etcdFlags{}
	var host, memory, address, transport string
	var labels []string
	var cpus, port int
	var ttl, margin time.Duration
	var failover bool
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
			// The watchdog may wait up to 1 s past the fence point for etcd's
			// answer (fleet.Agent.watchdog): the margin must exceed that.
			if ttl < 2*time.Second || margin < 1500*time.Millisecond || margin >= ttl {
				return usageError{fmt.Errorf("--ttl %s, --self-fence-margin %s: want a TTL of at least 2s and a margin from 1.5s to less than the TTL", ttl, margin)}
			}
			if port != 0 && (address == "" || e.ca == "" || e.cert == "") {
				return usageError{errors.New("--migration-port needs --migration-address and the fleet's TLS files (--etcd-ca, --etcd-cert, --etcd-key): the port takes only fleet hosts")}
			}
			log := slog.New(slog.NewTextHandler(os.Stderr, nil))
			return e.with(func(s *fleet.Store) error {
				return g.with(func(sup *supervisor.Supervisor) error {
					a := &fleet.Agent{Store: s, Sup: sup, Host: h, State: filepath.Join(g.root, "fleet"), TTL: ttl, SelfFenceMargin: margin, Log: log}
					if failover {
						if _, err := exec.LookPath("rbd"); err != nil {
							return fmt.Errorf("--failover needs the Ceph tools (rbd, ceph) to fence lost hosts: %w (or --failover=false)", err)
						}
						a.Fence = &fleet.CephFencer{History: func(vm, image, owner string) {
							log.Warn("fenced", "vm", vm, "image", image, "owner", owner)
						}}
					}
					if port != 0 {
						srv, _, err := fleet.PeerTLS(e.ca, e.cert, e.key)
						if err != nil {
							return err
						}
						l, err := net.Listen("tcp", net.JoinHostPort(address, strconv.Itoa(port)))
						if err != nil {
							return fmt.Errorf("--migration-port: %w", err)
						}
						a.Host.Migration.Receiver = l.Addr().String()
						go fleet.ServeMigrations(cmd.Context(), l, srv, sup, log)
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
	f.DurationVar(&margin, "self-fence-margin", 3*time.Second, "an agent that has not renewed its lease for TTL minus this kills its VMs")
	return c
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
