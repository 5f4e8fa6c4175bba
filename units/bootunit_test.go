package units_test

import (
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"

	"github.com/vmsup/vmsup/units"
)

// TestBootUnit: the rendered file escapes what systemd would expand or split,
// systemd-analyze accepts it, and Install/Uninstall do what "systemctl
// enable/disable" do, reporting changes only when there are some.
func TestBootUnit(t *testing.T) {
	dir := t.TempDir()
	b := units.BootUnit{
		Name:        "vmsup.service",
		Description: "start\nVMs",
		ExecStart:   []string{"/bin/echo", "--root", filepath.Join(dir, "a b"), "100%", "$HOME", `say "hi"`},
		Wants:       []string{"network-online.target"},
		After:       []string{"local-fs.target"},
		WantedBy:    "multi-user.target",
	}
	body, err := b.Render()
	if err != nil {
		t.Fatal(err)
	}
	for _, want := range []string{
		"Description=start VMs\n",
		`ExecStart=/bin/echo --root "` + filepath.Join(dir, "a b") + `" 100%% $$HOME "say \"hi\""` + "\n",
		"Wants=network-online.target\nAfter=network-online.target local-fs.target\n",
		"Type=oneshot\nRemainAfterExit=yes\n",
		"[Install]\nWantedBy=multi-user.target\n",
	} {
		if !strings.Contains(string(body), want) {
			t.Fatalf("unit lacks %q:\n%s", want, body)
		}
	}
	if path, err := exec.LookPath("systemd-analyze"); err == nil {
		f := filepath.Join(dir, "vmsup.service")
		if err := os.WriteFile(f, body, 0o644); err != nil {
			t.Fatal(err)
		}
		if out, err := exec.Command(path, "verify", "--man=no", f).CombinedOutput(); err != nil {
			t.Fatalf("systemd-analyze verify: %v\n%s\n%s", err, out, body)
		}
	} else {
		t.Log("skipped systemd-analyze verify: not installed")
	}

	etc := filepath.Join(dir, "etc")
	if changed, err := b.Install(etc); err != nil || !changed {
		t.Fatalf("install: %v %v", changed, err)
	}
	if changed, err := b.Install(etc); err != nil || changed {
		t.Fatalf("second install changed something: %v %v", changed, err)
	}
	link := filepath.Join(etc, "multi-user.target.wants", "vmsup.service")
	if target, err := os.Readlink(link); err != nil || target != filepath.Join(etc, "vmsup.service") {
		t.Fatalf("not enabled: %q %v", target, err)
	}
	if changed, err := b.Uninstall(etc); err != nil || !changed {
		t.Fatalf("uninstall: %v %v", changed, err)
	}
	if changed, err := b.Uninstall(etc); err != nil || changed {
		t.Fatalf("second uninstall: %v %v", changed, err)
	}
	if _, err := os.Lstat(link); !os.IsNotExist(err) {
		t.Fatalf("link left: %v", err)
	}
	if _, err := (units.BootUnit{Name: "x.service", ExecStart: []string{"a\nb"}, WantedBy: "t.target"}).Render(); err == nil {
		t.Fatal("a newline in a command word was accepted")
	}
}
