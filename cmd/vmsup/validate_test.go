package main

import (
	"strings"
	"testing"
)

// TestCLIValidateOneRun: one validate run names every problem of a file:
// a value of the wrong type, a bad value and a missing bridge (a host
// check), one line each in file order, exit 1.
func TestCLIValidateOneRun(t *testing.T) {
	dir := t.TempDir()
	p := write(t, dir, "one.toml", "name='one'\nmemory='256M'\ncpus='two'\nmachine='q99'\n[boot]\nkernel='"+env.Guest.Kernel+"'\n"+
		"[[nic]]\nname='lan'\ntype='bridge'\nbridge='nosuchbr0'\n")
	r := vmsup(t, t.TempDir(), "", "validate", p)
	want := "vmsup: " + p + ":3:6: cpus: want a whole number, not a TOML string\n" +
		"vmsup: " + p + ":4:1: machine: unknown machine \"q99\" (want \"q35\" or \"pc\")\n" +
		"vmsup: " + p + ":10:1: nic[0].bridge: nic \"lan\": no Linux bridge \"nosuchbr0\" on this host\n"
	if r.code != 1 || r.stderr != want || r.stdout != "" {
		t.Fatalf("validate: %+v\nwant exit 1, stderr:\n%s", r, want)
	}
	// Sizes in flags are binary too: "1GB" is refused, not taken as 1G.
	r = vmsup(t, t.TempDir(), "", "set", "nosuch", "--memory", "1GB")
	if want := "vmsup: --memory: \"1GB\" is ambiguous: write \"1G\" (GiB, 1024^3) or \"1000M\"\n"; r.code != 2 || r.stderr != want {
		t.Fatalf("set --memory 1GB: %+v\nwant exit 2, stderr %s", r, want)
	}
	if strings.Contains(r.stdout, "nosuch") {
		t.Errorf("set ran: %q", r.stdout)
	}
}
