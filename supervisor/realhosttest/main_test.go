package realhosttest

import (
	"context"
	"fmt"
	"os"
	"path/filepath"
	"testing"
	"time"

	"github.com/vmsup/vmsup/internal/dev/testenv"
)

// DefaultImageDir is where scripts/build-real-host.sh caches the image
// unless $VMSUP_REALHOST_DIR says otherwise.
const DefaultImageDir = "/var/cache/vmsup/realhost"

var (
	env      *testenv.Env
	vmsupBin string
	debFile  string
	imageDir string
	// skipAll is why the test cannot run here: it skips with it.
	skipAll string
)

func TestMain(m *testing.M) { os.Exit(runMain(m)) }

func runMain(m *testing.M) int {
	switch {
	case os.Getenv("VMSUP_REALHOST_TEST") == "":
		skipAll = "the real-host test boots a Debian host VM for ~6 minutes: it runs as its own step of " +
			"scripts/test.sh; set VMSUP_REALHOST_TEST=1 to run it"
		return m.Run()
	case os.Geteuid() != 0:
		skipAll = "the real-host test needs root (systemd sandbox, QEMU)"
		return m.Run()
	}
	dir, err := os.MkdirTemp("", "vmsup-realhost-")
	if err != nil {
		fmt.Println(err)
		return 1
	}
	defer os.RemoveAll(dir)
	t0 := time.Now()
	if imageDir, skipAll = buildImage(); skipAll != "" {
		return m.Run()
	}
	fmt.Printf("realhosttest: image %s ready in %s\n", imageDir, time.Since(t0).Round(time.Millisecond))
	ctx, cancel := context.WithTimeout(context.Background(), 15*time.Minute)
	defer cancel()
	t1 := time.Now()
	if debFile, err = testenv.BuildDeb(ctx, dir); err != nil {
		fmt.Println(err)
		return 1
	}
	fmt.Printf("realhosttest: %s built in %s\n", filepath.Base(debFile), time.Since(t1).Round(time.Millisecond))
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

// buildImage runs scripts/build-real-host.sh (at once when its cached image
// is fresh; a cold build downloads ~250 MB and takes minutes) and returns
// the image's directory, or why there is none.
func buildImage() (dir, why string) {
	dir = os.Getenv("VMSUP_REALHOST_DIR")
	if dir == "" {
		dir = DefaultImageDir
	}
	return dir, testenv.BuildImage("build-real-host.sh", dir, "the host image", 40*time.Minute)
}
