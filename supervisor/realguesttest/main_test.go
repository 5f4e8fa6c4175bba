package realguesttest

import (
	"context"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"testing"
	"time"

	"github.com/vmsup/vmsup/internal/dev/testenv"
	"github.com/vmsup/vmsup/supervisor"
)

// The managed network the guest is on, in the test binary's own network
// namespace: the host side (this process) has its gateway address.
const (
	labNet = "lab"
	labGW  = "10.78.0.1"
)

// DefaultImageDir is where scripts/build-real-guest.sh caches the image
// unless $VMSUP_REALGUEST_DIR says otherwise.
const DefaultImageDir = "/var/cache/vmsup/realguest"

var (
	env      *testenv.Env
	vmsupBin string
	imageDir string
	// noImage is why the real guest cannot boot here (the build's
	// reason): every test skips with it.
	noImage string
)

func TestMain(m *testing.M) {
	if code, ok := testenv.InPrivateNetns(); ok {
		os.Exit(code)
	}
	os.Exit(runMain(m))
}

func runMain(m *testing.M) int {
	if os.Geteuid() != 0 {
		fmt.Println("real-guest tests need root (namespaces, nftables, systemd sandbox, QEMU); skipping all")
		return 0
	}
	for _, bin := range []string{"dnsmasq", "nft"} {
		if _, err := exec.LookPath(bin); err != nil {
			fmt.Printf("%s not installed (Debian packages dnsmasq-base, nftables: scripts/install-deps.sh); skipping all\n", bin)
			return 0
		}
	}
	dir, err := os.MkdirTemp("", "vmsup-realguest-")
	if err != nil {
		fmt.Println(err)
		return 1
	}
	defer os.RemoveAll(dir)
	t0 := time.Now()
	if imageDir, noImage = buildImage(); noImage != "" {
		return m.Run() // every test skips, saying why: no sandbox to start
	}
	fmt.Printf("realguesttest: image %s ready in %s\n", imageDir, time.Since(t0).Round(time.Millisecond))
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Minute)
	defer cancel()
	if vmsupBin, err = testenv.BuildVmsup(ctx, dir); err != nil {
		fmt.Println(err)
		return 1
	}
	env, err = testenv.Start(ctx, filepath.Join(dir, "env"))
	if err != nil {
		fmt.Println("test environment:", err)
		return 1
	}
	defer env.Close()
	return m.Run()
}

// buildImage runs scripts/build-real-guest.sh (at once when its cached
// image is fresh; a cold build downloads ~150 MB and takes minutes) and
// returns the image's directory, or why there is none.
func buildImage() (dir, why string) {
	dir = os.Getenv("VMSUP_REALGUEST_DIR")
	if dir == "" {
		dir = DefaultImageDir
	}
	return dir, testenv.BuildImage("build-real-guest.sh", dir, "the real guest", 30*time.Minute)
}

// skipUnlessImage skips t unless the real guest can boot here.
func skipUnlessImage(t testing.TB) {
	t.Helper()
	testenv.SkipUnlessRoot(t)
	if noImage != "" {
		t.Skip(noImage)
	}
}

// newSup is a Supervisor on the sandbox that may also name the image's
// directory (the VM's root disk is an overlay on the cached image).
func newSup(t testing.TB) *supervisor.Supervisor {
	t.Helper()
	s, err := supervisor.New(supervisor.Options{
		Root:       t.TempDir(),
		SystemdBus: env.Systemd.BusAddress, QEMU: env.QEMU, HostCaps: env.Caps,
		JournalDir: env.Systemd.JournalDir,
		Self:       vmsupBin,
		AllowPaths: append(append([]string{}, env.AllowPaths...), imageDir),
		BlockDirs:  env.BlockDirs,
	})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { s.Close() })
	return s
}

// cli runs the vmsup CLI against sup's root and the sandbox.
func cli(ctx context.Context, sup *supervisor.Supervisor, args ...string) (string, error) {
	full := append([]string{"--root", sup.Root(), "--systemd-bus", env.Systemd.BusAddress}, args...)
	out, err := exec.CommandContext(ctx, vmsupBin, full...).CombinedOutput()
	return string(out), err
}
