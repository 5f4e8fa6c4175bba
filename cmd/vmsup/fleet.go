package main

import (
	"context"
	"errors"
	"fmt"
	"io"
	"maps"
	"os"
	"slices"
	"strings"
	"text/tabwriter"
	"time"

	"github.com/spf13/cobra"
	"go.etcd.io/etcd/client/pkg/v3/transport"
	clientv3 "go.etcd.io/etcd/client/v3"
	"go.uber.org/zap"

	"github.com/vmsup/vmsup/fleet"
	"github.com/vmsup/vmsup/spec"
	"github.com/vmsup/vmsup/supervisor"
)

// etcdFlags point a fleet command (or the agent) at the fleet's etcd.
type etcdFlags struct {
	endpoints              []string
	ca, cert, key, prefix  string
	dialTimeout, opTimeout time.Duration
}

func (e *etcdFlags) add(c *cobra.Command) {
	pf := c.PersistentFlags()
	pf.StringSliceVar(&e.endpoints, "etcd", splitList(os.Getenv("VMSUP_ETCD_ENDPOINTS")), "etcd client URLs, comma-separated (env VMSUP_ETCD_ENDPOINTS)")
	pf.StringVar(&e.ca, "etcd-ca", os.Getenv("VMSUP_ETCD_CA"), "CA certificate that signed etcd's server certificates (env VMSUP_ETCD_CA)")
	pf.StringVar(&e.cert, "etcd-cert", os.Getenv("VMSUP_ETCD_CERT"), "client certificate for etcd (env VMSUP_ETCD_CERT)")
	pf.StringVar(&e.key, "etcd-key", os.Getenv("VMSUP_ETCD_KEY"), "client certificate's key (env VMSUP_ETCD_KEY)")
	pf.StringVar(&e.prefix, "etcd-prefix", envOr("VMSUP_ETCD_PREFIX", "/vmsup/"), "the fleet's keys in etcd (env VMSUP_ETCD_PREFIX)")
	pf.DurationVar(&e.opTimeout, "etcd-timeout", 5*time.Second, "bound on each etcd request (a cluster without quorum answers with an error, not a hang)")
	e.dialTimeout = 3 * time.Second
}

func splitList(s string) []string {
	if s == "" {
		return nil
	}
	return strings.Split(s, ",")
}

// store connects to etcd; close it after.
func (e *etcdFlags) store() (*fleet.Store, error) {
	if len(e.endpoints) == 0 {
		return nil, usageError{errors.New("no etcd: give --etcd URL,... (or VMSUP_ETCD_ENDPOINTS)")}
	}
	// etcd's client logs retries as JSON on stderr: vmsup says what failed itself.
	cfg := clientv3.Config{Endpoints: e.endpoints, DialTimeout: e.dialTimeout, Logger: zap.NewNop(), DialOptions: fleet.DialOptions()}
	if e.cert != "" || e.ca != "" {
		tc, err := transport.TLSInfo{CertFile: e.cert, KeyFile: e.key, TrustedCAFile: e.ca}.ClientConfig()
		if err != nil {
			return nil, fmt.Errorf("etcd TLS: %w", err)
		}
		cfg.TLS = tc
	}
	c, err := clientv3.New(cfg)
	if err != nil {
		return nil, fmt.Errorf("etcd %s: %w", strings.Join(e.endpoints, ","), err)
	}
	s := fleet.NewStore(c, e.prefix)
	s.Timeout = e.opTimeout
	return s, nil
}

func (e *etcdFlags) with(fn func(*fleet.Store) error) error {
	s, err := e.store()
	if err != nil {
		return err
	}
	defer s.Client().Close()
	return fn(s)
}

func fleetCmd(g *globals) *cobra.Command {
	e := &etcdFlags{}
	c := &cobra.Command{
		Use:   "fleet",
		Short: "Run VMs on many hosts: desired state in etcd, one vmsup agent per host",
	}
	e.add(c)
	c.AddCommand(fleetApplyCmd(g, e), fleetLsCmd(g, e), fleetHostsCmd(g, e), fleetRmCmd(g, e), fleetDrainCmd(g, e), fleetUncordonCmd(g, e),
		fleetConnectCmd(e))
	return c
}

func fleetApplyCmd(g *globals, e *etcdFlags) *cobra.Command {
	return &cobra.Command{
		Use:   "apply FILE...",
		Short: "Store the VMs' specs in the fleet (all or none); the scheduler places them and their hosts' agents run them",
		Long: "Store the VMs' specs in the fleet (all or none); the scheduler places them and their hosts' agents run them.\n" +
			"Each file's host paths must be in the places this host allows (--image-dir, --block-dir, --config-dir,\n" +
			"--allow-path: configure the fleet's hosts alike); each agent checks them again against its own host's.\n" +
			"A disk's stored image (image = ALIAS) is recorded as this host's store has it (digest and source):\n" +
			"a host that lacks it pulls it by digest before the VM's start there.",
		Args: cobra.MinimumNArgs(1),
		RunE: func(cmd *cobra.Command, args []string) error {
			fs, err := loadFiles(nil, args) // files only: the fleet's VMs are in etcd
			if err != nil {
				return err // nothing stored: one bad file stops them all
			}
			if err := g.with(func(sup *supervisor.Supervisor) error {
				var errs []error
				for _, f := range fs {
					errs = append(errs, sup.CheckPaths(cmd.Context(), f))
				}
				return errors.Join(errs...)
			}); err != nil {
				return err
			}
			return e.with(func(s *fleet.Store) error {
				// Each VM's images as this host's store has them: the
				// fleet's hosts pull them by digest.
				store := g.imageStore()
				res, err := s.ApplyImages(cmd.Context(), func(f *spec.File) ([]fleet.ImageRef, error) { return fleet.ResolveImages(store, f) }, fs...)
				if err != nil {
					return err
				}
				for i, r := range res {
					g.out.action(actionJSON{Name: r.Name, File: fs[i].Path, Action: r.Action, Note: fmt.Sprintf("generation %d", r.Generation)},
						fmt.Sprintf("%s: %s (generation %d)", r.Name, r.Action, r.Generation))
				}
				return nil
			})
		},
	}
}

// fleetVMJSON is one line of fleet ls.
type fleetVMJSON struct {
	Name       string      `json:"name"`
	Host       string      `json:"host"`
	Target     string      `json:"target"`
	State      fleet.State `json:"state"`
	Reason     string      `json:"reason"`
	Generation int64       `json:"generation"` // the spec's
	Running    int64       `json:"running_generation"`
}

// load reads the fleet; without quorum, a member's possibly stale copy,
// and a note that says so.
func load(ctx context.Context, s *fleet.Store) (*fleet.Snapshot, string, error) {
	snap, err := s.Load(ctx, false)
	if errors.Is(err, fleet.ErrNoQuorum) {
		if snap, serr := s.Load(ctx, true); serr == nil {
			return snap, "etcd has no quorum: this is a member's last known state; nothing is placed or moved until quorum returns, and running VMs run on", nil
		}
	}
	return snap, "", err
}

// reading runs fn on the fleet as a read command sees it (load); in text
// mode the no-quorum note goes to stderr first.
func (e *etcdFlags) reading(g *globals, cmd *cobra.Command, fn func(snap *fleet.Snapshot, note string) error) error {
	return e.with(func(s *fleet.Store) error {
		snap, note, err := load(cmd.Context(), s)
		if err != nil {
			return err
		}
		if note != "" && !g.out.json {
			fmt.Fprintln(os.Stderr, "vmsup: "+note)
		}
		return fn(snap, note)
	})
}

func fleetLsCmd(g *globals, e *etcdFlags) *cobra.Command {
	return &cobra.Command{
		Use:   "ls",
		Short: "Where each fleet VM runs and its state",
		Args:  cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			return e.reading(g, cmd, func(snap *fleet.Snapshot, note string) error {
				var rows []fleetVMJSON
				for _, name := range slices.Sorted(maps.Keys(snap.VMs)) {
					rec, p, st := snap.VMs[name].Value, snap.Placements[name].Value, snap.Statuses[name].Value
					r := fleetVMJSON{Name: name, Host: p.Host, Target: p.Target, State: st.State, Reason: st.Reason, Generation: rec.Generation, Running: st.Generation}
					if r.State == "" {
						r.State = fleet.StatePending
					}
					if _, alive := snap.Hosts[p.Host]; p.Host != "" && !alive && r.State != fleet.StateLost {
						r.Reason = strings.TrimPrefix(r.Reason+"; ", "; ") + "host " + p.Host + " is not alive (no lease)"
					}
					rows = append(rows, r)
				}
				if rows == nil {
					rows = []fleetVMJSON{}
				}
				return g.out.object(struct {
					VMs  []fleetVMJSON `json:"vms"`
					Note string        `json:"note"`
				}{rows, note}, func(w io.Writer) {
					tw := tabwriter.NewWriter(w, 0, 4, 2, ' ', 0)
					fmt.Fprintln(tw, "NAME\tHOST\tSTATE\tGEN\tREASON")
					for _, r := range rows {
						host := r.Host
						if r.Target != "" {
							host += " -> " + r.Target
						}
						gen := fmt.Sprint(r.Generation)
						if r.Running != r.Generation && r.Running != 0 {
							gen = fmt.Sprintf("%d (runs %d)", r.Generation, r.Running)
						}
						fmt.Fprintf(tw, "%s\t%s\t%s\t%s\t%s\n", r.Name, orDash(host), r.State, gen, r.Reason)
					}
					tw.Flush()
				})
			})
		},
	}
}

// fleetHostJSON is one line of fleet hosts.
type fleetHostJSON struct {
	Name       string            `json:"name"`
	State      string            `json:"state"` // ready, draining, down (cordoned, no agent)
	CPUs       int               `json:"cpus"`
	CPUsUsed   int               `json:"cpus_used"`
	Memory     int64             `json:"memory"`
	MemoryUsed int64             `json:"memory_used"`
	Labels     map[string]string `json:"labels"`
	VMs        []string          `json:"vms"`
	Address    string            `json:"migration_address"`
}

func fleetHostsCmd(g *globals, e *etcdFlags) *cobra.Command {
	return &cobra.Command{
		Use:   "hosts",
		Short: "The fleet's hosts (live agents): capacity, use, labels, VMs",
		Args:  cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			return e.reading(g, cmd, func(snap *fleet.Snapshot, note string) error {
				rows := hostRows(snap)
				return g.out.object(struct {
					Hosts []fleetHostJSON `json:"hosts"`
					Note  string          `json:"note"`
				}{rows, note}, func(w io.Writer) {
					tw := tabwriter.NewWriter(w, 0, 4, 2, ' ', 0)
					fmt.Fprintln(tw, "HOST\tSTATE\tVCPUS\tMEMORY\tLABELS\tVMS")
					for _, h := range rows {
						var labels []string
						for _, k := range slices.Sorted(maps.Keys(h.Labels)) {
							labels = append(labels, k+"="+h.Labels[k])
						}
						fmt.Fprintf(tw, "%s\t%s\t%d/%d\t%s/%s\t%s\t%s\n", h.Name, h.State, h.CPUsUsed, h.CPUs,
							spec.Size(h.MemoryUsed), spec.Size(h.Memory), orDash(strings.Join(labels, ",")), orDash(strings.Join(h.VMs, ",")))
					}
					tw.Flush()
				})
			})
		},
	}
}

func hostRows(snap *fleet.Snapshot) []fleetHostJSON {
	byName := map[string]*fleetHostJSON{}
	for name, h := range snap.Hosts {
		st := "ready"
		if h.Draining {
			st = "draining"
		}
		byName[name] = &fleetHostJSON{Name: name, State: st, CPUs: h.CPUs, Memory: h.Memory, Labels: h.Labels, VMs: []string{}, Address: h.Migration.Address}
	}
	for name := range snap.Cordoned {
		if byName[name] == nil {
			byName[name] = &fleetHostJSON{Name: name, State: "down, draining", Labels: map[string]string{}, VMs: []string{}}
		}
	}
	for _, name := range slices.Sorted(maps.Keys(snap.Placements)) {
		p := snap.Placements[name].Value
		h := byName[p.Host]
		rec, ok := snap.VMs[name]
		if h == nil || !ok {
			continue
		}
		h.VMs = append(h.VMs, name)
		if f, err := spec.Parse(rec.Value.File, []byte(rec.Value.TOML)); err == nil {
			h.CPUsUsed += f.VM.CPUs
			h.MemoryUsed += int64(f.VM.Memory)
		}
	}
	rows := []fleetHostJSON{}
	for _, name := range slices.Sorted(maps.Keys(byName)) {
		if byName[name].Labels == nil {
			byName[name].Labels = map[string]string{}
		}
		rows = append(rows, *byName[name])
	}
	return rows
}

func fleetRmCmd(g *globals, e *etcdFlags) *cobra.Command {
	return &cobra.Command{
		Use:   "rm NAME...",
		Short: "Remove VMs from the fleet: their hosts' agents stop them and forget their state (disk images stay)",
		Args:  cobra.MinimumNArgs(1),
		RunE: func(cmd *cobra.Command, args []string) error {
			return e.with(func(s *fleet.Store) error {
				for _, name := range args {
					if err := s.Remove(cmd.Context(), name); err != nil {
						return fmt.Errorf("fleet vm %s: %w", name, err)
					}
					g.out.action(actionJSON{Name: name, Action: "removed", Note: "its agent stops it"}, name+": removed from the fleet (its agent stops it)")
				}
				return nil
			})
		},
	}
}

func fleetDrainCmd(g *globals, e *etcdFlags) *cobra.Command {
	var timeout time.Duration
	c := &cobra.Command{
		Use:   "drain HOST",
		Short: "Move every VM off HOST by live migration and keep new VMs off it (until fleet uncordon)",
		Args:  cobra.ExactArgs(1),
		RunE: func(cmd *cobra.Command, args []string) error {
			host := args[0]
			return e.with(func(s *fleet.Store) error {
				if err := s.Cordon(cmd.Context(), host, true); err != nil {
					return err
				}
				ctx, cancel := context.WithTimeout(cmd.Context(), timeout)
				defer cancel()
				moved := map[string]bool{}
				before, err := s.Load(ctx, false)
				if err != nil {
					return err
				}
				for {
					snap, err := s.Load(ctx, false)
					if err != nil {
						return fmt.Errorf("drain %s: %w", host, err)
					}
					left := 0
					for name, p := range snap.Placements {
						if p.Value.Host == host {
							left++
						} else if before.Placements[name].Value.Host == host && !moved[name] {
							moved[name] = true
							g.out.action(actionJSON{Name: name, Action: "migrated", State: string(snap.Statuses[name].Value.State), Note: "to " + p.Value.Host},
								fmt.Sprintf("%s: moved to %s", name, p.Value.Host))
						}
					}
					if left == 0 {
						g.out.action(actionJSON{Name: host, Action: "drained"}, "host "+host+": drained (fleet uncordon "+host+" takes VMs again)")
						return nil
					}
					select {
					case <-ctx.Done():
						return fmt.Errorf("drain %s: %d VMs still there after %s (fleet ls says why)", host, left, timeout)
					case <-time.After(500 * time.Millisecond):
					}
				}
			})
		},
	}
	c.Flags().DurationVar(&timeout, "timeout", 30*time.Minute, "give up waiting after this long (the drain goes on)")
	return c
}

func fleetUncordonCmd(g *globals, e *etcdFlags) *cobra.Command {
	return &cobra.Command{
		Use:   "uncordon HOST",
		Short: "Let a drained host take VMs again",
		Args:  cobra.ExactArgs(1),
		RunE: func(cmd *cobra.Command, args []string) error {
			return e.with(func(s *fleet.Store) error {
				if err := s.Cordon(cmd.Context(), args[0], false); err != nil {
					return err
				}
				g.out.action(actionJSON{Name: args[0], Action: "uncordoned"}, "host "+args[0]+": takes VMs again")
				return nil
			})
		},
	}
}

// fleetConnectCmd is a drain's transport: the source's migration protocol
// on stdin/stdout, piped to the target agent's migration port.
func fleetConnectCmd(e *etcdFlags) *cobra.Command {
	return &cobra.Command{
		Use:    "migrate-connect ADDR:PORT",
		Short:  "Pipe stdin/stdout to another agent's migration port (a drain's transport)",
		Hidden: true,
		Args:   cobra.ExactArgs(1),
		RunE: func(cmd *cobra.Command, args []string) error {
			_, client, err := fleet.PeerTLS(e.ca, e.cert, e.key)
			if err != nil {
				return err
			}
			return fleet.Connect(cmd.Context(), args[0], client, os.Stdin, os.Stdout)
		},
	}
}
