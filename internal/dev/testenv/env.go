package testenv

import (
	"context"
	"errors"
	"fmt"
	"os"
	"testing"
	"time"

	"github.com/vmsup/vmsup/internal/host/caps"
)

// Env is what a test package shares: one systemd sandbox and the guest image.
type Env struct {
	Systemd *Systemd
	Guest   GuestImage
	Dir     string // the directory given to Start (Main makes and removes its own)
	// QEMU is the binary the tests run (QEMUBinary); Caps is the host
	// probe's record for it, cached in CapsCache.
	QEMU      string
	Caps      *caps.Caps
	CapsCache string
	// AllowPaths and BlockDirs are the host places the tests' VM files may
	// name (AllowPaths, BlockDirs).
	AllowPaths, BlockDirs []string
}

// AllowPaths are the places the tests' VM files may name beyond a state
// root's images (supervisor.Options.AllowPaths; the CLI gets them as
// VMSUP_ALLOW_PATHS through CLIEnv): the temporary directory tests write
// their images, seeds and configurations in, and the guest's directory.
// No default of vmsup's allows /tmp. For the helpers tests run in a child
// process, which have no Env.
func AllowPaths() []string { return []string{os.TempDir(), guestDir()} }

// BlockDirs are where the tests' block devices are named
// (supervisor.Options.BlockDirs, VMSUP_BLOCK_DIRS): all of /dev, for the
// loop devices (/dev/loopN) tests make.
func BlockDirs() []string { return []string{"/dev"} }

// Start builds (or reuses) the guest image and boots a systemd sandbox under dir.
// Callers that make dir themselves remove it; see Main for the usual TestMain use.
func Start(ctx context.Context, dir string) (*Env, error) {
	type guestResult struct {
		g   GuestImage
		err error
	}
	gc := make(chan guestResult, 1)
	go func() { g, err := Guest(ctx); gc <- guestResult{g, err} }()
	e := &Env{Dir: dir, QEMU: QEMUBinary()}
	var capsErr error
	capsDone := make(chan struct{})
	go func() { e.Caps, e.CapsCache, capsErr = probeHost(ctx, dir); close(capsDone) }()
	sd, sdErr := StartSystemd(ctx, dir)
	gr := <-gc
	<-capsDone
	if err := errors.Join(sdErr, gr.err, capsErr); err != nil {
		if sd != nil {
			sd.Stop()
		}
		return nil, err
	}
	e.Systemd, e.Guest = sd, gr.g
	e.AllowPaths, e.BlockDirs = AllowPaths(), BlockDirs()
	if ok, why := e.Caps.KVM.Starts(); !ok {
		fmt.Printf("testenv: QEMU %s: no KVM here (%s): tests that need it skip\n", e.QEMU, why)
	}
	return e, nil
}

// Close stops the sandbox. It is safe to call twice.
func (e *Env) Close() error {
	if e == nil || e.Systemd == nil {
		return nil
	}
	return e.Systemd.Stop()
}

// Main runs a package's tests with one Env for the whole package and returns the exit
// code for os.Exit. setup receives the Env before any test runs (store it in a package
// variable). Without root it runs the tests with no Env, so each test that needs one must
// call SkipUnlessRoot; with root, a failure to start the Env fails the package loudly.
func Main(m *testing.M, setup func(*Env) error) int {
	if os.Geteuid() != 0 {
		// Every test of a package using Main needs the sandbox or the guest.
		fmt.Println("testenv: not root: no systemd sandbox, QEMU guest or namespaces; skipping all tests of this package")
		return 0
	}
	RemoveGoneQEMUUsers() // of earlier runs killed before their end
	defer RemoveGoneQEMUUsers()
	dir, err := os.MkdirTemp("", "vmsup-env-")
	if err != nil {
		fmt.Fprintln(os.Stderr, "testenv:", err)
		return 1
	}
	defer os.RemoveAll(dir)
	// A cold guest build downloads ~70 MB and takes ~10 s; leave room for slow mirrors.
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Minute)
	env, err := Start(ctx, dir)
	cancel()
	if err != nil {
		fmt.Fprintln(os.Stderr, "testenv: cannot start the test environment:", err)
		return 1
	}
	code := 0
	if setup != nil {
		if err := setup(env); err != nil {
			fmt.Fprintln(os.Stderr, "testenv: setup:", err)
			code = 1
		}
	}
	if code == 0 {
		code = m.Run()
	}
	if err := env.Close(); err != nil {
		fmt.Fprintln(os.Stderr, "testenv: stop:", err)
		if code == 0 {
			code = 1
		}
	}
	return code
}

// SkipUnlessRoot skips the test, saying why, unless it runs as root (the systemd
// sandbox, cgroups, QEMU with KVM and network namespaces all need root).
func SkipUnlessRoot(t testing.TB) {
	t.Helper()
	if os.Geteuid() != 0 {
		t.Skipf("needs root (running as uid %d): systemd sandbox, cgroups and guests need it", os.Geteuid())
	}
}
