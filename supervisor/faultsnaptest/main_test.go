package faultsnaptest_test

import (
	"context"
	"os"
	"testing"

	"github.com/vmsup/vmsup/internal/dev/testenv"
	"github.com/vmsup/vmsup/supervisor/supervisortest"
)

// env is the systemd sandbox and test guest this package shares; vmsupBin
// the CLI the units call back into.
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
	os.Exit(testenv.Main(m, func(e *testenv.Env) (err error) {
		env = e
		vmsupBin, err = testenv.BuildVmsup(context.Background(), e.Dir)
		return err
	}))
}

type (
	faultJob  = supervisortest.FaultJob
	faultSide = supervisortest.Side
)
