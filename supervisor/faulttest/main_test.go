package faulttest_test

import (
	"context"
	"os"
	"testing"

	"github.com/vmsup/vmsup/internal/dev/testenv"
	"github.com/vmsup/vmsup/supervisor"
	"github.com/vmsup/vmsup/supervisor/supervisortest"
)

// env is the one systemd sandbox and test guest this package shares; vmsupBin
// is the CLI the units call for their graceful stop hook.
var (
	env      *testenv.Env
	vmsupBin string
)

func TestMain(m *testing.M) {
	// A command under fault runs in a child: this binary again
	// (supervisortest.RunJob).
	if len(os.Args) > 2 && os.Args[1] == "-fault-helper" {
		os.Exit(supervisortest.FaultHelper(os.Args[2]))
	}
	// A network namespace of its own: the fault suite's bridge, taps and
	// veths stay out of the host's.
	if code, ok := testenv.InPrivateNetns(); ok {
		os.Exit(code)
	}
	os.Exit(testenv.Main(m, func(e *testenv.Env) (err error) {
		env = e
		vmsupBin, err = testenv.BuildVmsup(context.Background(), e.Dir)
		return err
	}))
}

// The fault machinery shared with the supervisor package's tests (its
// full-filesystem test and apply kills), under the names these tests use.
type (
	faultJob  = supervisortest.FaultJob
	faultSide = supervisortest.Side
)

func sideOf(t *testing.T, name string, sd *testenv.Systemd, root, unitDir string, sup *supervisor.Supervisor) *faultSide {
	return supervisortest.NewSide(t, env, vmsupBin, name, sd, root, unitDir, sup)
}
