package main

import (
	"context"
	"fmt"
	"io"
	"net"
	"os"
	"strings"
	"text/tabwriter"
	"time"

	"github.com/spf13/cobra"

	"github.com/vmsup/vmsup/remoteapi"
	"github.com/vmsup/vmsup/supervisor"
)

func statsCmd(g *globals) *cobra.Command {
	return &cobra.Command{
		Use:   "stats [NAME|FILE...]",
		Short: "Show VMs' CPU, memory, disk and NIC figures (counters since QEMU started)",
		Long: "Show VMs' figures: CPU time of the unit's cgroup and the time the vCPUs waited for a host\n" +
			"CPU (steal seen from the host), memory (the unit's, the balloon's, the guest's when its balloon\n" +
			"driver reports), per disk QEMU's query-blockstats, per NIC the tap's counters (as the guest\n" +
			"sees them), uptime. Without NAME, every VM; VMs being started or stopped are left out.",
		Args: cobra.ArbitraryArgs,
		RunE: func(cmd *cobra.Command, args []string) error {
			return g.ops(func(sup remoteapi.Ops) error {
				names, err := vmNames(args)
				if err != nil {
					return err
				}
				vms, _, err := sup.Stats(cmd.Context(), names...)
				if err != nil {
					return err
				}
				if g.json {
					if vms == nil {
						vms = []supervisor.VMStats{}
					}
					return g.out.object(vms, nil)
				}
				printStats(cmd.OutOrStdout(), vms)
				return nil
			})
		},
	}
}

// printStats prints one block per VM.
func printStats(w io.Writer, vms []supervisor.VMStats) {
	tw := tabwriter.NewWriter(w, 0, 4, 2, ' ', 0)
	for _, v := range vms {
		fmt.Fprintf(tw, "%s\t%s\tuptime %s\n", v.Name, v.State, time.Duration(v.Uptime*float64(time.Second)).Round(time.Second))
		if !v.Up {
			continue
		}
		fmt.Fprintf(tw, "  cpu\t%.2fs (user %.2fs, system %.2fs), vCPUs waited %.2fs\t%d vCPUs\n", v.CPU.UsageSeconds, v.CPU.UserSeconds, v.CPU.SystemSeconds, v.CPU.DelaySeconds, v.CPU.VCPUs)
		m := v.Memory
		line := "  memory\tunit " + humanBytes(float64(m.RSSBytes))
		if m.BalloonActualBytes > 0 {
			line += ", balloon " + humanBytes(float64(m.BalloonActualBytes))
		}
		if m.GuestTotalBytes > 0 {
			line += fmt.Sprintf(", guest %s total, %s available", humanBytes(float64(m.GuestTotalBytes)), humanBytes(float64(m.GuestAvailableBytes)))
		}
		fmt.Fprintln(tw, line)
		for _, d := range v.Disks {
			fmt.Fprintf(tw, "  disk %s\tread %s in %d ops, wrote %s in %d ops, %d flushes\n", d.Name, humanBytes(float64(d.ReadBytes)), d.ReadOps, humanBytes(float64(d.WriteBytes)), d.WriteOps, d.FlushOps)
		}
		for _, n := range v.NICs {
			fmt.Fprintf(tw, "  nic %s\t(%s) received %s, sent %s, dropped %d/%d\n", n.Name, n.HostIf, humanBytes(float64(n.RxBytes)), humanBytes(float64(n.TxBytes)), n.RxDropped, n.TxDropped)
		}
	}
	tw.Flush()
}

func topCmd(g *globals) *cobra.Command {
	var every time.Duration
	c := &cobra.Command{
		Use:   "top [NAME|FILE...]",
		Short: "Show VMs' CPU, memory, disk and network rates, refreshed on the terminal (q quits)",
		Long: "Show VMs' CPU, memory, disk and network rates, refreshed on the terminal, until q or Ctrl-C.\n" +
			"NET is the taps' traffic: that of a user-mode NIC (type = \"user\") cannot be measured from the\n" +
			"host, so a VM without a tap shows \"-\" there.",
		Args: cobra.ArbitraryArgs,
		RunE: func(cmd *cobra.Command, args []string) error {
			if g.json {
				return usageError{fmt.Errorf("top refreshes a terminal: it has no --json form (vmsup stats --json)")}
			}
			if every < 100*time.Millisecond {
				return usageError{fmt.Errorf("--every %s: at least 100ms", every)}
			}
			return g.ops(func(sup remoteapi.Ops) error {
				names, err := vmNames(args)
				if err != nil {
					return err
				}
				return runTop(cmd, sup, names, every)
			})
		},
	}
	c.Flags().DurationVar(&every, "every", 2*time.Second, "refresh interval")
	return c
}

// runTop prints a table of rates between two samples, until q is typed
// on the terminal or the command is interrupted.
func runTop(cmd *cobra.Command, sup remoteapi.Ops, names []string, every time.Duration) error {
	out := cmd.OutOrStdout()
	var quit <-chan struct{}
	if in, ok := cmd.InOrStdin().(*os.File); ok {
		var restore func()
		quit, restore = topInput(in)
		defer restore()
	}
	prev := map[string]supervisor.VMStats{}
	last := time.Now()
	for {
		vms, _, err := sup.Stats(cmd.Context(), names...)
		if err != nil {
			return err
		}
		now := time.Now()
		dt := now.Sub(last).Seconds()
		var b strings.Builder
		b.WriteString("\x1b[H\x1b[2J") // home, clear
		fmt.Fprintf(&b, "vmsup top - %s, every %s\n\n", now.Format("15:04:05"), every)
		tw := tabwriter.NewWriter(&b, 0, 4, 2, ' ', tabwriter.AlignRight)
		fmt.Fprintln(tw, "NAME\tSTATE\tCPU%\tWAIT%\tMEMORY\tDISK R/s\tDISK W/s\tNET RX/s\tNET TX/s\tUPTIME\t")
		for _, v := range vms {
			p, ok := prev[v.Name]
			rate := func(cur, old float64) string {
				if !ok || dt <= 0 || cur < old {
					return "-"
				}
				return humanBytes((cur-old)/dt) + "/s"
			}
			pct := func(cur, old float64) string {
				if !ok || dt <= 0 || cur < old {
					return "-"
				}
				return fmt.Sprintf("%.1f", 100*(cur-old)/dt)
			}
			rd, wr, rx, tx := totals(v)
			ord, owr, orx, otx := totals(p)
			netRate := func(cur, old float64) string {
				if len(v.NICs) == 0 {
					return "-" // no tap: nothing vmsup can measure
				}
				return rate(cur, old)
			}
			fmt.Fprintf(tw, "%s\t%s\t%s\t%s\t%s\t%s\t%s\t%s\t%s\t%s\t\n", v.Name, v.State,
				pct(v.CPU.UsageSeconds, p.CPU.UsageSeconds), pct(v.CPU.DelaySeconds, p.CPU.DelaySeconds),
				humanBytes(float64(v.Memory.RSSBytes)), rate(rd, ord), rate(wr, owr), netRate(rx, orx), netRate(tx, otx),
				time.Duration(v.Uptime*float64(time.Second)).Round(time.Second))
			prev[v.Name] = v
		}
		tw.Flush()
		if _, err := io.WriteString(out, b.String()); err != nil {
			return err
		}
		last = now
		select {
		case <-cmd.Context().Done():
			return nil
		case <-quit:
			return nil
		case <-time.After(every):
		}
	}
}

// totals sums a VM's disk and NIC byte counters.
func totals(v supervisor.VMStats) (rd, wr, rx, tx float64) {
	for _, d := range v.Disks {
		rd, wr = rd+float64(d.ReadBytes), wr+float64(d.WriteBytes)
	}
	for _, n := range v.NICs {
		rx, tx = rx+float64(n.RxBytes), tx+float64(n.TxBytes)
	}
	return
}

func metricsCmd(g *globals) *cobra.Command {
	var (
		install, uninstall, serve, collect bool
		listen, via                        string
	)
	c := &cobra.Command{
		Use:   "metrics",
		Short: "Print every VM's figures in Prometheus's text format, or install a socket-activated endpoint",
		Long: "Print every VM's figures in Prometheus's text exposition format (vmsup_vm_cpu_seconds_total{vm=...}\n" +
			"and so on). --install installs and starts vmsup-metrics.socket and vmsup-metrics@.service\n" +
			"(in --unit-dir): systemd listens on --listen and runs one short vmsup per scrape, as a dynamic\n" +
			"user that asks vmsup-metrics-collect.socket (" + supervisor.MetricsCollectSocket + ") for the figures,\n" +
			"so nothing runs between scrapes. --uninstall removes them.",
		Args: cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			if g.json {
				return usageError{fmt.Errorf("metrics prints Prometheus's text format: it has no --json form (vmsup stats --json)")}
			}
			switch {
			case install && uninstall:
				return usageError{fmt.Errorf("--install and --uninstall: pick one")}
			case install:
				exe, err := os.Executable()
				if err != nil {
					return err
				}
				return g.with(func(sup *supervisor.Supervisor) error {
					err := sup.InstallMetrics(cmd.Context(), supervisor.MetricsInstall{Listen: listen, Self: exe})
					if err == nil {
						fmt.Fprintf(cmd.OutOrStdout(), "metrics: %s.socket listens on %s (units in %s)\n", supervisor.MetricsUnit, listen, g.unitDir)
					}
					return err
				})
			case uninstall:
				return g.with(func(sup *supervisor.Supervisor) error { return sup.UninstallMetrics(cmd.Context()) })
			case via != "":
				// The endpoint's instance: no state root, no systemd.
				return serveScrape(cmd, supervisor.CollectVia(via))
			case serve:
				// What an endpoint installed by an older vmsup runs (as root).
				return g.with(func(sup *supervisor.Supervisor) error { return serveScrape(cmd, sup.WriteMetrics) })
			case collect:
				return g.with(func(sup *supervisor.Supervisor) error { return sup.CollectMetrics(cmd.Context(), cmd.OutOrStdout()) })
			}
			return g.with(func(sup *supervisor.Supervisor) error { return sup.WriteMetrics(cmd.Context(), cmd.OutOrStdout()) })
		},
	}
	c.Flags().BoolVar(&install, "install", false, "install and start the socket-activated endpoint")
	c.Flags().BoolVar(&uninstall, "uninstall", false, "stop and remove the endpoint's units")
	c.Flags().StringVar(&listen, "listen", "127.0.0.1:9475", "address the endpoint listens on (with --install)")
	c.Flags().BoolVar(&serve, "http", false, "answer one HTTP request on stdin/stdout with the figures (an older install's service)")
	c.Flags().StringVar(&via, "http-via", "", "answer one HTTP request on stdin/stdout with the figures the collector at this socket gives (the endpoint's service)")
	c.Flags().BoolVar(&collect, "collect", false, "write the figures for the endpoint to stdout (the collector's service)")
	for _, f := range []string{"http", "http-via", "collect"} {
		_ = c.Flags().MarkHidden(f)
	}
	return c
}

// serveScrape answers the one HTTP request systemd connected to stdin and
// stdout (Accept=yes) with the figures collect writes.
func serveScrape(cmd *cobra.Command, collect func(context.Context, io.Writer) error) error {
	conn, err := net.FileConn(os.Stdin)
	if err != nil {
		return fmt.Errorf("metrics: standard input is not a connection: %w", err)
	}
	defer conn.Close()
	return supervisor.ServeScrape(cmd.Context(), conn, collect)
}
