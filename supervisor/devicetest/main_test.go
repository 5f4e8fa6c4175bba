package devicetest

import (
	"context"
	"fmt"
	"os"
	"os/exec"
	"strconv"
	"strings"
	"syscall"
	"testing"

	"github.com/vmsup/vmsup/internal/dev/testenv"
	"github.com/vmsup/vmsup/spec"
	"github.com/vmsup/vmsup/supervisor"
	"github.com/vmsup/vmsup/supervisor/supervisortest"
)

// One systemd sandbox and one test guest for the package.
var (
	env      *testenv.Env
	vmsupBin string
	// huge is the hugetlbfs mount the package made, or why there is none.
	huge hugeMount
)

func TestMain(m *testing.M) {
	if len(os.Args) > 1 && os.Args[1] == "-crash-helper" {
		os.Exit(crashHelper(os.Args[2:]))
	}
	// Before the sandbox starts: its mount namespace is a copy of the
	// host's at that moment.
	huge = mountHugepages(hugePages)
	code := testenv.Main(m, func(e *testenv.Env) (err error) {
		env = e
		vmsupBin, err = testenv.BuildVmsup(context.Background(), e.Dir)
		return err
	})
	huge.undo()
	os.Exit(code)
}

// hugePages are the 2 MiB pages the package reserves: a 128M guest and room.
const hugePages = 80

type hugeMount struct {
	dir, skip string
	before    int // nr_hugepages before the package raised it
}

const nrHugepages = "/proc/sys/vm/nr_hugepages"

// mountHugepages reserves n more 2 MiB pages and mounts a hugetlbfs of
// the package's own (under /var/tmp: QEMU's unit has a private /tmp).
func mountHugepages(n int) hugeMount {
	if os.Geteuid() != 0 {
		return hugeMount{skip: "not root"}
	}
	b, err := os.ReadFile(nrHugepages)
	if err != nil {
		return hugeMount{skip: fmt.Sprintf("no hugepages on this kernel: %v", err)}
	}
	h := hugeMount{before: -1}
	before, _ := strconv.Atoi(strings.TrimSpace(string(b)))
	if err := os.WriteFile(nrHugepages, []byte(strconv.Itoa(before+n)), 0o644); err != nil {
		h.skip = fmt.Sprintf("reserve %d hugepages: %v", n, err)
		return h
	}
	h.before = before
	if h.dir, err = os.MkdirTemp("/var/tmp", "vmsup-huge-"); err != nil {
		h.skip = err.Error()
		return h
	}
	if out, err := exec.Command("mount", "-t", "hugetlbfs", "-o", "pagesize=2M,mode=0755", "hugetlbfs", h.dir).CombinedOutput(); err != nil {
		h.skip = fmt.Sprintf("mount hugetlbfs: %v: %s", err, out)
		os.Remove(h.dir)
		h.dir = ""
	}
	return h
}

func (h hugeMount) undo() {
	if h.dir != "" && h.skip == "" {
		_ = exec.Command("umount", h.dir).Run()
		os.Remove(h.dir)
	}
	if h.before >= 0 {
		_ = os.WriteFile(nrHugepages, []byte(strconv.Itoa(h.before)), 0o644)
	}
}

// upVM writes body as dir/NAME.toml and brings the VM up with a supervisor
// of the package's sandbox; the VM goes down when the test ends.
func upVM(t *testing.T, ctx context.Context, dir, name, body string) (*supervisor.Supervisor, *spec.File) {
	t.Helper()
	sup := supervisortest.New(t, env, "", vmsupBin)
	return sup, supervisortest.UpTOML(t, ctx, sup, dir, name, body)
}

// status is the VM's status.
func status(t *testing.T, ctx context.Context, sup *supervisor.Supervisor, name string) supervisor.Status {
	t.Helper()
	st, err := sup.Status(ctx, name)
	if err != nil {
		t.Fatal(err)
	}
	return st
}

// crashHelper runs in a child process: Up of FILE, or with "hostdev SYS DEV
// ADDR" after it an attach of the host device ADDR to the running VM of
// FILE (SYS and DEV its sysfs and /dev), killing itself with SIGKILL right
// after the named step, as if vmsup died there.
func crashHelper(args []string) int {
	root, bus, self, file, killAfter := args[0], args[1], args[2], args[3], args[4]
	o := supervisor.Options{Root: root, SystemdBus: bus, Self: self, AllowPaths: testenv.AllowPaths(), BlockDirs: testenv.BlockDirs(),
		AfterStep: func(_, step string) {
			if step == killAfter {
				_ = syscall.Kill(os.Getpid(), syscall.SIGKILL)
			}
		}}
	hostdev := len(args) == 9 && args[5] == "hostdev"
	if hostdev {
		o.SysRoot, o.DevRoot = args[6], args[7]
	}
	sup, err := supervisor.New(o)
	if err != nil {
		fmt.Println(err)
		return 1
	}
	f, err := spec.Load(file)
	if err != nil {
		fmt.Println(err)
		return 1
	}
	if hostdev {
		err = sup.AttachHostDev(context.Background(), f.VM.Name, spec.HostDev{Address: args[8]})
	} else {
		_, err = sup.Up(context.Background(), f)
	}
	if err != nil {
		fmt.Println(err)
		return 1
	}
	return 0
}

// shell dials the VM's console shell with the kernel's console messages
// off (dmesg -n 1): under load the kernel prints (clocksource warnings)
// in the middle of a command's output.
func shell(t *testing.T, ctx context.Context, st supervisor.Status) *testenv.GuestShell {
	t.Helper()
	sh := supervisortest.Shell(t, ctx, st)
	if _, _, err := sh.Run(ctx, "dmesg -n 1"); err != nil {
		t.Fatal(err)
	}
	return sh
}
