package hugepages

import (
	"errors"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/vmsup/vmsup/spec"
)

// fakeHost writes a /proc and /sys tree: mountinfo lines, and free/total
// pages by /sys directory name.
func fakeHost(t *testing.T, mountinfo string, pages map[string][2]string) Host {
	t.Helper()
	root := t.TempDir()
	write := func(p, data string) {
		p = filepath.Join(root, p)
		if err := os.MkdirAll(filepath.Dir(p), 0o755); err != nil {
			t.Fatal(err)
		}
		if err := os.WriteFile(p, []byte(data), 0o644); err != nil {
			t.Fatal(err)
		}
	}
	write("proc/self/mountinfo", mountinfo)
	write("proc/meminfo", "MemTotal:       24000000 kB\nHugepagesize:       2048 kB\n")
	for dir, n := range pages {
		write("sys/kernel/mm/hugepages/"+dir+"/nr_hugepages", n[0]+"\n")
		write("sys/kernel/mm/hugepages/"+dir+"/free_hugepages", n[1]+"\n")
	}
	return Host{Root: root}
}

const (
	devHugepages = "41 24 0:40 / /dev/hugepages rw,relatime shared:17 - hugetlbfs hugetlbfs rw,pagesize=2M\n"
	noPagesize   = "41 24 0:40 / /dev/hugepages rw,relatime shared:17 - hugetlbfs hugetlbfs rw\n"
	oneG         = "90 24 0:55 / /mnt/huge\\0401G rw,relatime - hugetlbfs none rw,pagesize=1024M\n"
	tmpfs        = "30 24 0:26 / /dev/shm rw,nosuid,nodev shared:4 - tmpfs tmpfs rw\n"
)

func TestMount(t *testing.T) {
	for _, c := range []struct {
		name, mountinfo string
		page            spec.Size
		want, wantErr   string
	}{
		{"2M with pagesize", tmpfs + devHugepages, 2 * spec.MiB, "/dev/hugepages", ""},
		{"2M by default size", noPagesize, 2 * spec.MiB, "/dev/hugepages", ""},
		{"1G, escaped path", devHugepages + oneG, spec.GiB, "/mnt/huge 1G", ""},
		{"1G missing", tmpfs + devHugepages, spec.GiB, "", "no hugetlbfs mounted for 1G pages"},
		{"none at all", tmpfs, 2 * spec.MiB, "", "no hugetlbfs mounted for 2M pages"},
	} {
		t.Run(c.name, func(t *testing.T) {
			got, err := fakeHost(t, c.mountinfo, nil).Mount(c.page)
			if c.wantErr != "" {
				if err == nil || !strings.Contains(err.Error(), c.wantErr) || !errors.Is(err, ErrNoMount) {
					t.Fatalf("Mount = %q, %v; want error %q", got, err, c.wantErr)
				}
				return
			}
			if err != nil || got != c.want {
				t.Fatalf("Mount = %q, %v; want %q", got, err, c.want)
			}
		})
	}
}

func TestCheck(t *testing.T) {
	vm := func(mem spec.Size, huge string) *spec.VM {
		return &spec.VM{Name: "x", Memory: mem, MaxMemory: mem, Hugepages: huge}
	}
	pages := map[string][2]string{"hugepages-2048kB": {"20", "10"}, "hugepages-1048576kB": {"2", "2"}}
	h := fakeHost(t, devHugepages, pages)
	for _, c := range []struct {
		name    string
		vm      *spec.VM
		want    string
		wantErr string
	}{
		{"no hugepages", vm(512*spec.MiB, ""), "", ""},
		{"enough", vm(20*spec.MiB, "2M"), "/dev/hugepages", ""},
		{"too few", vm(512*spec.MiB, "2M"), "",
			"512M needs 256 free 2M pages, the host has 10 free (echo 266 > /sys/kernel/mm/hugepages/hugepages-2048kB/nr_hugepages)"},
		{"1G pages but no mount", vm(spec.GiB, "1G"), "", "no hugetlbfs mounted for 1G pages"},
	} {
		t.Run(c.name, func(t *testing.T) {
			got, err := h.Check(c.vm)
			if c.wantErr != "" {
				if err == nil || !strings.Contains(err.Error(), c.wantErr) {
					t.Fatalf("Check = %q, %v; want error %q", got, err, c.wantErr)
				}
				return
			}
			if err != nil || got != c.want {
				t.Fatalf("Check = %q, %v; want %q", got, err, c.want)
			}
		})
	}
	// A kernel without the size at all.
	_, err := fakeHost(t, devHugepages+oneG, nil).Check(vm(spec.GiB, "1G"))
	if err == nil || !strings.Contains(err.Error(), "this kernel has no 1G hugepages") {
		t.Fatalf("Check without /sys pages: %v", err)
	}
}

// TestDirOf: a VM's directory is on the mount of its page size.
func TestDirOf(t *testing.T) {
	vm := &spec.VM{Name: "web", Hugepages: spec.Hugepages1G}
	if got, err := fakeHost(t, devHugepages+oneG, nil).DirOf(vm); err != nil || got != "/mnt/huge 1G/vmsup-web" {
		t.Errorf("DirOf = %q, %v", got, err)
	}
	if _, err := fakeHost(t, devHugepages, nil).DirOf(vm); !errors.Is(err, ErrNoMount) {
		t.Errorf("no mount of its size: %v", err)
	}
}
