package main

import (
	"context"
	"fmt"
	"io"
	"net"
	"net/http"
	"os/exec"
	"path/filepath"
	"strings"
	"time"

	"github.com/vmsup/vmsup/internal/dev/bench"
	"github.com/vmsup/vmsup/supervisor"
)

// scrape is section 7: one Prometheus scrape of N running idle VMs, through
// the socket-activated endpoint (systemd starts one vmsup per connection),
// as the CLI `vmsup metrics`, and libvirt's `virsh domstats` of as many
// domains for comparison (what prometheus-libvirt-exporter asks libvirtd).
func (f *fixture) scrape(ctx context.Context) error {
	const sec = "7. metrics scrape (idle VMs, no guest OS, TCG, 64 MiB each)"
	for _, n := range f.cfg.scrape {
		fl, err := f.fleets(n, 64, fmt.Sprintf("p%d", n))
		if err != nil {
			return err
		}
		vmsupF, lvF := fl[0], fl[3]
		step(fmt.Sprintf("scrape: %d VMs through vmsup", n))
		// up is idempotent: a QEMU too slow to answer while 100 start on
		// 2 cores is started again, the running ones are left alone.
		for try := 1; ; try++ {
			_, err := vmsupF.up(ctx)
			if err == nil {
				break
			}
			if try == 3 {
				return err
			}
		}
		endpoint, cli, missed, err := f.scrapeVmsup(ctx, n)
		if _, derr := vmsupF.down(ctx); err == nil && derr != nil {
			err = derr
		}
		f.cleanup()
		if err != nil {
			return err
		}
		step(fmt.Sprintf("scrape: %d libvirt domains", n))
		if _, err := lvF.up(ctx); err != nil {
			return err
		}
		var domstats []float64
		for range f.cfg.reps {
			t0 := time.Now()
			if err := f.lv.virsh(ctx, "domstats"); err != nil {
				return err
			}
			domstats = append(domstats, ms(time.Since(t0)))
		}
		if _, err := lvF.down(ctx); err != nil {
			return err
		}
		f.cleanup()
		base := "virsh domstats (libvirtd)"
		fig := fmt.Sprintf("one scrape of %d VMs", n)
		f.report.Add(bench.Row{Section: sec, Figure: fig, Variant: "vmsup endpoint (socket-activated, HTTP GET)", Accel: "tcg", Unit: "ms",
			Summary: bench.Summarize(endpoint), Baseline: base, Failures: missed,
			Note: "goal: under 1000 ms for 100 VMs; failures: VMs a scrape reported down (both variants)"})
		f.report.Add(bench.Row{Section: sec, Figure: fig, Variant: "vmsup metrics (CLI)", Accel: "tcg", Unit: "ms",
			Summary: bench.Summarize(cli), Baseline: base})
		f.report.Add(bench.Row{Section: sec, Figure: fig, Variant: base, Accel: "tcg", Unit: "ms", Summary: bench.Summarize(domstats)})
	}
	return nil
}

// scrapeVmsup installs the endpoint on a free loopback port and times
// scrapes through it and through the CLI, checking each saw n VMs up.
func (f *fixture) scrapeVmsup(ctx context.Context, n int) (endpoint, cli []float64, missed int, err error) {
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		return nil, nil, 0, err
	}
	addr := l.Addr().String()
	l.Close()
	root := filepath.Join(f.dir, "root")
	sup, err := supervisor.New(supervisor.Options{Root: root, SystemdBus: f.env.Systemd.BusAddress, UnitDir: f.env.Systemd.UnitDir,
		Self: f.vmsupBin, QEMU: f.env.QEMU, HostCaps: f.env.Caps, AllowPaths: f.env.AllowPaths, BlockDirs: f.env.BlockDirs})
	if err != nil {
		return nil, nil, 0, err
	}
	defer sup.Close()
	argv := []string{f.vmsupBin, "--root", root, "--systemd-bus", f.env.Systemd.BusAddress, "metrics"}
	if err := sup.InstallMetrics(ctx, supervisor.MetricsInstall{Listen: addr, Self: f.vmsupBin}); err != nil {
		return nil, nil, 0, err
	}
	defer sup.UninstallMetrics(context.Background())
	prefix := fmt.Sprintf("vmsup_vm_up{vm=\"p%ds", n) // this fleet's (others' records stay, shut off)
	// A VM a scrape reports down (its QEMU did not answer within the
	// scrape's bound) counts as a failure, not an error.
	check := func(body string) error {
		up := 0
		for _, l := range strings.Split(body, "\n") {
			if strings.HasPrefix(l, prefix) && strings.HasSuffix(l, " 1") {
				up++
			}
		}
		missed += n - up
		if up == 0 {
			return fmt.Errorf("a scrape saw none of the fleet's %d VMs up", n)
		}
		return nil
	}
	for range f.cfg.reps {
		t0 := time.Now()
		resp, err := http.Get("http://" + addr + "/metrics")
		if err != nil {
			return nil, nil, 0, err
		}
		body, err := io.ReadAll(resp.Body)
		resp.Body.Close()
		d := time.Since(t0)
		if err != nil {
			return nil, nil, 0, err
		}
		if err := check(string(body)); err != nil {
			return nil, nil, 0, err
		}
		endpoint = append(endpoint, ms(d))
		t0 = time.Now()
		out, err := exec.CommandContext(ctx, argv[0], argv[1:]...).Output()
		d = time.Since(t0)
		if err != nil {
			return nil, nil, 0, fmt.Errorf("vmsup metrics: %w", err)
		}
		if err := check(string(out)); err != nil {
			return nil, nil, 0, err
		}
		cli = append(cli, ms(d))
	}
	return endpoint, cli, missed, nil
}

func ms(d time.Duration) float64 { return float64(d.Microseconds()) / 1000 }
