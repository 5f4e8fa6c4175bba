package imagestore_test

import (
	"context"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/vmsup/vmsup/internal/dev/testenv"
	"github.com/vmsup/vmsup/internal/imagestore"
	"github.com/vmsup/vmsup/internal/ops/plan"
	"github.com/vmsup/vmsup/internal/vm/vmstore"
	"github.com/vmsup/vmsup/spec"
	"github.com/vmsup/vmsup/supervisor"
	"github.com/vmsup/vmsup/supervisor/supervisortest"
)

// The sandbox and guest, started by the first test that boots a VM.
var (
	envOnce  sync.Once
	env      *testenv.Env
	envErr   error
	envDir   string
	vmsupBin string
)

func TestMain(m *testing.M) {
	code := m.Run()
	if env != nil {
		env.Close()
		testenv.RemoveGoneQEMUUsers()
	}
	if envDir != "" {
		os.RemoveAll(envDir)
	}
	os.Exit(code)
}

func sandbox(t *testing.T) *testenv.Env {
	t.Helper()
	testenv.SkipUnlessRoot(t)
	envOnce.Do(func() {
		ctx, cancel := context.WithTimeout(context.Background(), 5*time.Minute)
		defer cancel()
		if envDir, envErr = os.MkdirTemp("", "vmsup-images-"); envErr != nil {
			return
		}
		if env, envErr = testenv.Start(ctx, envDir); envErr != nil {
			return
		}
		vmsupBin, envErr = testenv.BuildVmsup(ctx, envDir)
	})
	if envErr != nil {
		t.Fatalf("test environment: %v", envErr)
	}
	return env
}

// Images pulled over HTTP and from a registry boot a VM, each a disk of
// it (the guest reads their markers, the first grown to its size); rm of
// one is refused naming the VM; a profile edit and an image change show
// in plan.
func TestPulledImagesBootVM(t *testing.T) {
	e := sandbox(t)
	reg := imagestore.StartTestRegistry(t)
	ctx := supervisortest.Context(t, 5*time.Minute)
	dir := t.TempDir()
	root := filepath.Join(dir, "root")
	sup := supervisortest.New(t, e, root, vmsupBin)
	store := imagestore.Store{Dir: imagestore.Dir(root)}

	httpImg, httpSum := imagestore.MakeImage(t, "VMSUP-MARK-HTTP")
	if _, err := store.Pull(ctx, imagestore.Pull{Source: imagestore.ServeImage(t, "/guest.qcow2", httpImg), SHA256: httpSum, Name: "guest-http"}); err != nil {
		t.Fatal(err)
	}
	ociImg, _ := imagestore.MakeImage(t, "VMSUP-MARK-OCI")
	ref, _ := imagestore.PushContainerDisk(t, reg, "disks/guest", ociImg)
	if _, err := store.Pull(ctx, imagestore.Pull{Source: ref, Insecure: true, Name: "guest-oci"}); err != nil {
		t.Fatal(err)
	}

	images := filepath.Join(root, "images")
	if err := os.MkdirAll(images, 0o711); err != nil {
		t.Fatal(err)
	}
	profile := filepath.Join(dir, "base.toml")
	writeProfile := func(memory string) {
		body := fmt.Sprintf("memory = %q\naccel = \"tcg\"\nstop_timeout = \"20s\"\n[boot]\nkernel = %q\ninitrd = %q\ncmdline = \"console=ttyS0 no_timer_check\"\n",
			memory, e.Guest.Kernel, e.Guest.Initrd)
		if err := os.WriteFile(profile, []byte(body), 0o644); err != nil {
			t.Fatal(err)
		}
	}
	writeProfile("256M")
	writeVM := func(imageA string) *spec.File {
		return supervisortest.LoadTOML(t, dir, "imgvm", fmt.Sprintf(`name = "imgvm"
include = ["base.toml"]
[[disk]]
name = "a"
file = %q
image = %q
size = "2M"
[[disk]]
name = "b"
file = %q
image = "guest-oci"
`, filepath.Join(images, "a.qcow2"), imageA, filepath.Join(images, "b.qcow2")))
	}
	f := writeVM("guest-http")
	if _, err := sup.Up(ctx, f); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { sup.Down(context.Background(), "imgvm") })
	st := supervisortest.WaitState(t, ctx, sup, "imgvm", supervisor.StateRunning, time.Minute)
	sh := supervisortest.Shell(t, ctx, st)
	out, _, err := sh.Run(ctx, "head -c 15 /dev/vda; echo; head -c 14 /dev/vdb; echo; cat /sys/block/vda/size")
	if err != nil {
		t.Fatal(err)
	}
	for _, want := range []string{"VMSUP-MARK-HTTP", "VMSUP-MARK-OCI", "4096"} {
		if !strings.Contains(out, want) {
			t.Errorf("guest sees %q, want %q in it", out, want)
		}
	}

	_, err = store.Remove(ctx, "guest-http", store.Users(vmstore.Store{Root: root}))
	if !errors.Is(err, imagestore.ErrInUse) || !strings.Contains(err.Error(), `VM "imgvm" (disk "a")`) {
		t.Errorf("rm of the VM's image: %v, want it refused naming VM imgvm", err)
	}
	t.Logf("rm refused: %v", err)

	writeProfile("384M")
	res, err := sup.Plan(ctx, writeVM("guest-oci"))
	if err != nil {
		t.Fatal(err)
	}
	var fields []string
	for _, c := range res.Changes {
		fields = append(fields, c.Field+":"+string(c.Class))
	}
	got := strings.Join(fields, " ")
	for _, want := range []string{"memory:", "disk[a].image:" + string(plan.Impossible)} {
		if !strings.Contains(got, want) {
			t.Errorf("plan after the profile and image edits: %s, want %s", got, want)
		}
	}
	t.Logf("plan: %s", got)
}
