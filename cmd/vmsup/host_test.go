package main

import (
	"os/exec"
	"regexp"
	"strconv"
	"strings"
	"testing"
)

// checkHostVersion: vmsup host names the version of the QEMU installed now
// (7.2, or 10 under with-qemu10), every other mention of a QEMU version in
// its output (the userfaultfd fact's) is that one, and its memory state
// line says file: with mapped-ram from QEMU 9 on, fd: before.
func checkHostVersion(t *testing.T, out string) {
	t.Helper()
	vout, err := exec.Command(env.QEMU, "--version").Output()
	if err != nil {
		t.Fatalf("%s --version: %v", env.QEMU, err)
	}
	m := regexp.MustCompile(`version (\d+)\.\d+\.\d+`).FindSubmatch(vout)
	if m == nil {
		t.Fatalf("%s --version: %q", env.QEMU, vout)
	}
	version := strings.TrimPrefix(string(m[0]), "version ")
	if !strings.Contains(out, "qemu:        "+env.QEMU+" "+version+" (") {
		t.Errorf("vmsup host does not name QEMU %s:\n%s", version, out)
	}
	for _, x := range regexp.MustCompile(`QEMU (\d+\.\d+(\.\d+)?)`).FindAllStringSubmatch(out, -1) {
		if x[1] != version {
			t.Errorf("vmsup host mentions QEMU %s, but the installed one is %s:\n%s", x[1], version, out)
		}
	}
	major, _ := strconv.Atoi(string(m[1]))
	want := "mem state:   fd: "
	if major >= 9 {
		want = "mem state:   file: with mapped-ram"
	}
	if !strings.Contains(out, want) {
		t.Errorf("QEMU %s: vmsup host has no line %q:\n%s", version, want, out)
	}
}
