package main

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/vmsup/vmsup/internal/dev/testenv"
)

// The CLI tests run the real vmsup binary against one systemd sandbox.
var (
	env      *testenv.Env
	vmsupBin string
)

func TestMain(m *testing.M) {
	os.Exit(testenv.Main(m, func(e *testenv.Env) (err error) {
		env = e
		vmsupBin, err = testenv.BuildVmsup(context.Background(), e.Dir)
		return err
	}))
}

type result struct {
	stdout, stderr string
	code           int
}

// vmsup runs the CLI with root as its state root.
func vmsup(t testing.TB, root string, stdin string, args ...string) result {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	cmd := vmsupCmd(ctx, root, args...)
	cmd.Stdin = strings.NewReader(stdin)
	var o, e bytes.Buffer
	cmd.Stdout, cmd.Stderr = &o, &e
	err := cmd.Run()
	r := result{stdout: o.String(), stderr: e.String()}
	var ee *exec.ExitError
	if errors.As(err, &ee) {
		r.code = ee.ExitCode()
	} else if err != nil {
		t.Fatalf("vmsup %v: %v", args, err)
	}
	return r
}

// vmsupCmd is the CLI with root as its state root, in the sandbox, not
// started.
func vmsupCmd(ctx context.Context, root string, args ...string) *exec.Cmd {
	cmd := exec.CommandContext(ctx, vmsupBin, args...)
	cmd.Env = append(os.Environ(),
		"VMSUP_ROOT="+root,
		"VMSUP_SYSTEMD_BUS="+env.Systemd.BusAddress,
		"VMSUP_JOURNAL_DIR="+env.Systemd.JournalDir,
		// vmsup enable must not touch this machine's /etc/systemd or /run.
		"VMSUP_UNIT_DIR="+filepath.Join(root, "etc-systemd"),
		"VMSUP_BOOT_TARGET="+testenv.BootTarget,
		"VMSUP_RUN_DIR="+filepath.Join(root, "run"))
	cmd.Env = append(cmd.Env, env.CLIEnv()...)
	return cmd
}

func guestTOML(name, extra string) string {
	return fmt.Sprintf(`name = %q
memory = "256M"
accel = "tcg"
stop_timeout = "20s"
%s
[boot]
kernel = %q
initrd = %q
cmdline = "console=ttyS0 no_timer_check"
`, name, extra, env.Guest.Kernel, env.Guest.Initrd)
}

func write(t testing.TB, dir, file, body string) string {
	t.Helper()
	p := filepath.Join(dir, file)
	if err := os.WriteFile(p, []byte(body), 0o644); err != nil {
		t.Fatal(err)
	}
	return p
}

// units lists the vmsup units the sandbox systemd has loaded.
func vmsupUnits(t testing.TB) string {
	out, _ := env.Systemd.Systemctl(context.Background(), "list-units", "--all", "--plain", "--no-legend", "vmsup-*")
	var lines []string
	for _, l := range strings.Split(strings.TrimSpace(string(out)), "\n") {
		f := strings.Fields(l)
		if len(f) > 0 && strings.HasPrefix(f[0], "vmsup-log@") {
			// A console logger runs while the guest prints and is gone
			// once it is quiet: only its socket, by name, is the VM's.
			if strings.HasSuffix(f[0], ".service") {
				continue
			}
			f = f[:1]
		}
		lines = append(lines, strings.Join(f, " "))
	}
	return strings.Join(lines, "\n")
}
