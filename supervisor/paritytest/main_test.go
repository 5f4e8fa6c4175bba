package paritytest

import (
	"context"
	"os"
	"testing"

	"github.com/vmsup/vmsup/internal/dev/testenv"
)

// One systemd sandbox and one test guest for the package.
var (
	env      *testenv.Env
	vmsupBin string
)

func TestMain(m *testing.M) {
	code := testenv.Main(m, func(e *testenv.Env) (err error) {
		env = e
		vmsupBin, err = testenv.BuildVmsup(context.Background(), e.Dir)
		return err
	})
	shared.Stop()
	os.Exit(code)
}
