package fleettest_test

import (
	"context"
	"os"

	"testing"

	"github.com/vmsup/vmsup/internal/dev/testenv"
)

// env is the test guest and QEMU this package shares (its own sandbox is
// not used: each fleet host has one); vmsupBin is the CLI the agents run.
var (
	env      *testenv.Env
	vmsupBin string
)

func TestMain(m *testing.M) {
	// The fleet's LAN (a bridge, etcd on it) lives in a namespace of its own.
	if code, ok := testenv.InPrivateNetns(); ok {
		os.Exit(code)
	}
	os.Exit(testenv.Main(m, func(e *testenv.Env) (err error) {
		env = e
		vmsupBin, err = testenv.BuildVmsup(context.Background(), e.Dir)
		return err
	}))
}
