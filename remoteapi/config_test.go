package remoteapi

import (
	"errors"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/vmsup/vmsup/supervisor"
)

func TestConfigRoles(t *testing.T) {
	p := filepath.Join(t.TempDir(), "remote.toml")
	os.WriteFile(p, []byte(`
[[grant]]
identity = "cn:ops"
role = "operator"
vms = ["web-*"]

[[grant]]
identity = "cn:ops"
role = "read-only"
vms = ["*"]
`), 0o600)
	c, err := LoadConfig(p)
	if err != nil {
		t.Fatal(err)
	}
	for _, tc := range []struct {
		id, vm string
		want   Role
	}{{"cn:ops", "web-1", Operator}, {"cn:ops", "db", ReadOnly}, {"cn:other", "web-1", ""}} {
		if got := c.RoleFor(tc.id, tc.vm); got != tc.want {
			t.Errorf("RoleFor(%s, %s) = %q, want %q", tc.id, tc.vm, got, tc.want)
		}
	}
	if c.IdleExit.D() != DefaultIdleExit || c.MaxCallsPerClient != DefaultMaxCallsPerClient {
		t.Errorf("defaults not filled: %+v", c)
	}
}

func TestConfigErrorsNameTheField(t *testing.T) {
	dir := t.TempDir()
	for body, want := range map[string]string{
		"idle = '1s'\n": "remote.toml:1:1: idle: unknown key",
		"[[grant]]\nidentity = 'bob'\nrole = 'root'\nvms = ['[']\n":  `grant[0].identity: "bob": want "cn:NAME" or "uid:N"`,
		"[[grant]]\nidentity = 'cn:a'\nrole = 'root'\nvms = ['*']\n": `grant[0].role: "root": want read-only, operator or admin`,
		"[[grant]]\nidentity = 'cn:a'\nrole = 'admin'\n":             "grant[0].vms: missing",
	} {
		p := filepath.Join(dir, "remote.toml")
		os.WriteFile(p, []byte(body), 0o600)
		if _, err := LoadConfig(p); err == nil || !strings.Contains(err.Error(), want) {
			t.Errorf("%q: %v, want %q", body, err, want)
		}
	}
}

// TestErrorKinds: a received error matches the supervisor's sentinels, so
// the CLI's exit codes are those of a local run.
func TestErrorKinds(t *testing.T) {
	for _, err := range []error{supervisor.ErrNotFound, supervisor.ErrNotRunning, supervisor.ErrInterrupted} {
		e := ErrorOf(err)
		if !errors.Is(e, err) {
			t.Errorf("%v (%s) does not match its sentinel", e, e.Kind)
		}
	}
	var be *supervisor.BusyError
	if e := ErrorOf(&supervisor.BusyError{VM: "a"}); e.Kind != KindBusy || !errors.As(e, &be) || e.ExitCode != 4 {
		t.Errorf("busy: %+v", e)
	}
}
