package netmanage_test

import (
	"context"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/vmsup/vmsup/internal/net/netmanage"
	"github.com/vmsup/vmsup/netsetup"
	"github.com/vmsup/vmsup/supervisor"
	"github.com/vmsup/vmsup/supervisor/supervisortest"
	"github.com/vmsup/vmsup/units"
)

// killed stands for SIGKILL in the command: the panic unwinds it at the
// step without ending its journal (its lock goes, as a dead process's does).
type killed struct{}

// A network rm killed after each of its steps is finished by the next
// command on the network (ls, up, rm, create in turn): nothing is left of
// it (bridge, NAT table, dnsmasq unit, directory, journal), and create
// makes it anew.
func TestRemoveKilledAtEachStep(t *testing.T) {
	ctx := supervisortest.Context(t, 5*time.Minute)
	sup := supervisortest.New(t, env, "", vmsupBin)
	const name = "killnet"
	def := filepath.Join(t.TempDir(), "killnet.toml")
	os.WriteFile(def, []byte(fmt.Sprintf("name = %q\nipv4 = \"10.78.0.1/24\"\nuplink = %q\n", name, uplink)), 0o644)
	next := [][]string{{"network", "ls"}, {"network", "up", name}, {"network", "rm", name}, {"network", "create", def}}
	steps := []string{"dnsmasq-stopped", "nat-removed", "bridge-deleted", "forgotten"}
	for i, step := range steps {
		if i == 0 || next[(i-1)%len(next)][1] != "create" {
			if out, err := cli(ctx, sup, "network", "create", def); err != nil {
				t.Fatalf("network create: %v\n%s", err, out)
			}
		}
		t0 := time.Now()
		killRemoveAfter(t, ctx, sup, name, step)
		cmd := next[i%len(next)]
		out, err := cli(ctx, sup, cmd...)
		t.Logf("killed after %s; then %s: %v %s (%s)", step, strings.Join(cmd, " "), err, strings.TrimSpace(out), time.Since(t0).Round(time.Millisecond))
		switch cmd[1] {
		case "up":
			if err == nil || !strings.Contains(out, "no such network") {
				t.Errorf("network up after a killed rm: %v %s, want no such network", err, out)
			}
		case "ls":
			if err != nil || grepLine(out, name+" ") != "" {
				t.Errorf("network ls after a killed rm: %v %s, want it gone", err, out)
			}
		default:
			if err != nil {
				t.Errorf("%s after a killed rm: %v %s", cmd[1], err, out)
			}
		}
		if cmd[1] == "create" {
			if out, err := cli(ctx, sup, "network", "rm", name); err != nil {
				t.Fatalf("network rm of the network made anew: %v\n%s", err, out)
			}
		}
		gone(t, ctx, sup, name)
	}
}

// killRemoveAfter runs the network's rm and "kills" it after step.
func killRemoveAfter(t *testing.T, ctx context.Context, sup *supervisor.Supervisor, name, step string) {
	m := sup.Networks()
	m.AfterStep = func(_, s string) {
		if s == step {
			panic(killed{})
		}
	}
	defer func() {
		if r := recover(); r != (killed{}) {
			t.Fatalf("rm not killed after %s: %v", step, r)
		}
	}()
	m.Remove(ctx, name)
}

// gone checks that nothing is left of the network.
func gone(t *testing.T, ctx context.Context, sup *supervisor.Supervisor, name string) {
	t.Helper()
	if netsetup.LinkExists("vmsn-" + name) {
		t.Error("bridge left")
	}
	for _, tl := range vmsupTables(t) {
		if strings.Contains(tl, name) {
			t.Errorf("nftables table left: %s", tl)
		}
	}
	sd, err := units.Connect(ctx, env.Systemd.BusAddress)
	if err != nil {
		t.Fatal(err)
	}
	defer sd.Close()
	if st, err := sd.Status(ctx, netmanage.DnsmasqUnit(name)); err != nil || st.Exists {
		t.Errorf("dnsmasq unit left: %+v %v", st, err)
	}
	for _, p := range []string{filepath.Join(sup.Root(), "networks", name), filepath.Join(sup.Root(), "networks", ".ops", "records", name)} {
		if _, err := os.Stat(p); err == nil {
			t.Errorf("%s left", p)
		}
	}
}
