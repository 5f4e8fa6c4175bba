package main

import (
	"encoding/json"
	"fmt"
	"net"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"testing"
	"time"
)

// TestMetrics: `vmsup metrics` passes promtool; --install sets up the
// socket-activated endpoint, which a real Prometheus scrapes for 3 VMs with
// no vmsup process alive between scrapes; an address in use and a second
// install are refused with nothing left behind; --uninstall removes it.
func TestMetrics(t *testing.T) {
	promtool, err1 := exec.LookPath("promtool")
	prom, err2 := exec.LookPath("prometheus")
	if err1 != nil || err2 != nil {
		t.Fatalf("Debian's prometheus package is needed (scripts/install-deps.sh installs it): %v %v", err1, err2)
	}
	root := t.TempDir()
	dir := t.TempDir()
	// VMs with nothing to boot: SeaBIOS waits; QEMU, its monitor and its
	// disk are all a scrape reads.
	for i := range 3 {
		name := fmt.Sprintf("m%d", i)
		file := write(t, dir, name+".toml", fmt.Sprintf("name = %q\nmemory = \"64M\"\naccel = \"tcg\"\nguest_agent = false\n[[disk]]\nname = \"d\"\nfile = %q\nsize = \"1M\"\nformat = \"raw\"\n",
			name, filepath.Join(dir, name+".raw")))
		if r := vmsup(t, root, "", "up", file); r.code != 0 {
			t.Fatalf("up %s: %s", name, r.stderr)
		}
		defer vmsup(t, root, "", "kill", name)
	}
	r := vmsup(t, root, "", "metrics")
	if r.code != 0 || strings.Count(r.stdout, "vmsup_vm_up{vm=") != 3 {
		t.Fatalf("metrics: %d %s\n%s", r.code, r.stderr, r.stdout)
	}
	check := exec.Command(promtool, "check", "metrics")
	check.Stdin = strings.NewReader(r.stdout)
	if out, err := check.CombinedOutput(); err != nil {
		t.Errorf("promtool check metrics: %v\n%s", err, out)
	}

	unitDir := env.Systemd.UnitDir
	port := freePort(t)
	taken, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer taken.Close()
	install := func(listen string) result {
		return vmsup(t, root, "", "--unit-dir", unitDir, "metrics", "--install", "--listen", listen)
	}
	if r := install(taken.Addr().String()); r.code == 0 || !strings.Contains(r.stderr, "address already in use") {
		t.Errorf("install on a taken address: %d %q", r.code, r.stderr)
	}
	if _, err := os.Stat(filepath.Join(unitDir, "vmsup-metrics.socket")); err == nil {
		t.Error("a refused install left its socket unit")
	}
	listen := "127.0.0.1:" + strconv.Itoa(port)
	if r := install(listen); r.code != 0 {
		t.Fatalf("metrics --install: %s", r.stderr)
	}
	defer vmsup(t, root, "", "--unit-dir", unitDir, "metrics", "--uninstall")
	if r := install("127.0.0.1:" + strconv.Itoa(freePort(t))); r.code == 0 || !strings.Contains(r.stderr, "already installed") {
		t.Errorf("a second install: %d %q", r.code, r.stderr)
	}

	// Prometheus, in a temporary directory on loopback.
	pport := freePort(t)
	pdir := t.TempDir()
	cfg := fmt.Sprintf("global:\n  scrape_interval: 1s\n  scrape_timeout: 900ms\nscrape_configs:\n  - job_name: vmsup\n    static_configs:\n      - targets: [%q]\n", listen)
	cfgPath := write(t, pdir, "prometheus.yml", cfg)
	ps := exec.Command(prom, "--config.file="+cfgPath, "--storage.tsdb.path="+filepath.Join(pdir, "data"),
		"--web.listen-address=127.0.0.1:"+strconv.Itoa(pport))
	plog, _ := os.Create(filepath.Join(pdir, "log"))
	ps.Stdout, ps.Stderr = plog, plog
	if err := ps.Start(); err != nil {
		t.Fatal(err)
	}
	defer func() { ps.Process.Kill(); ps.Wait() }()
	query := func(q string) (float64, bool) {
		resp, err := http.Get("http://127.0.0.1:" + strconv.Itoa(pport) + "/api/v1/query?query=" + q)
		if err != nil {
			return 0, false
		}
		defer resp.Body.Close()
		var out struct {
			Data struct {
				Result []struct {
					Value []any `json:"value"`
				} `json:"result"`
			} `json:"data"`
		}
		if json.NewDecoder(resp.Body).Decode(&out) != nil || len(out.Data.Result) != 1 || len(out.Data.Result[0].Value) != 2 {
			return 0, false
		}
		v, err := strconv.ParseFloat(out.Data.Result[0].Value[1].(string), 64)
		return v, err == nil
	}
	deadline := time.Now().Add(60 * time.Second)
	for {
		if n, ok := query("count(vmsup_vm_up==1)"); ok && n == 3 {
			break
		}
		if time.Now().After(deadline) {
			b, _ := os.ReadFile(filepath.Join(pdir, "log"))
			t.Fatalf("Prometheus has no 3 VMs up within 60s:\n%s", tail(string(b), 3000))
		}
		time.Sleep(500 * time.Millisecond)
	}
	if n, ok := query(`sum(scrape_samples_scraped{job="vmsup"})`); !ok || n < 30 {
		t.Errorf("samples per scrape: %v %v", n, ok)
	}
	// Between scrapes no vmsup runs: over 3 s (3 scrapes) a scrape's
	// process is seen only briefly, never the same one a second apart.
	seenAt := map[int]time.Time{}
	idle := 0
	for end := time.Now().Add(3 * time.Second); time.Now().Before(end); time.Sleep(50 * time.Millisecond) {
		pids := scrapePIDs()
		if len(pids) == 0 {
			idle++
		}
		for _, pid := range pids {
			if first, ok := seenAt[pid]; !ok {
				seenAt[pid] = time.Now()
			} else if time.Since(first) > time.Second {
				t.Errorf("vmsup metrics process %d alive for over a second: resident", pid)
			}
		}
	}
	if idle == 0 {
		t.Errorf("no moment without a vmsup process in 3 s (%d samples idle)", idle)
	}
	t.Logf("%d scrape processes seen, %d of the samples with none running", len(seenAt), idle)
}

// scrapePIDs lists the running `vmsup metrics --http` processes.
func scrapePIDs() []int {
	ents, _ := os.ReadDir("/proc")
	var out []int
	for _, e := range ents {
		pid, err := strconv.Atoi(e.Name())
		if err != nil {
			continue
		}
		b, err := os.ReadFile("/proc/" + e.Name() + "/cmdline")
		if err == nil && strings.HasPrefix(string(b), vmsupBin+"\x00") && strings.Contains(string(b), "\x00metrics\x00--http") {
			out = append(out, pid)
		}
	}
	return out
}
