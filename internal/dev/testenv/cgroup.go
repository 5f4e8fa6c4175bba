package testenv

import (
	"bufio"
	"bytes"
	"errors"
	"fmt"
	"io/fs"
	"os"
	"path/filepath"
	"regexp"
	"sort"
	"strconv"
	"strings"
	"syscall"
	"time"
)

// cgroupTree is the cgroup directory one sandbox owns in every v1 hierarchy and in the
// unified one. systemd takes the path of its own cgroup in the name=systemd hierarchy
// as its root and uses that same path in every controller's hierarchy, so the directory
// must exist everywhere before systemd starts, or it silently applies no limits.
//
// The tree is nested under the caller's own memory cgroup (so QEMU and everything else
// the sandbox runs stays inside the memory accounting the caller is in), with the same
// relative path in the other hierarchies.
type cgroupTree struct {
	rel    string            // path below each hierarchy root: <caller's>/vmsup-test-<pid>-<n>
	mounts map[string]string // hierarchy key (controller, "systemd", "unified") -> mount point
	all    []string          // distinct mount points
	own    map[string]string // mount point -> this process's cgroup in it
	track  string            // mount point of the hierarchy systemd tracks processes in
}

var staleName = regexp.MustCompile(`^vmsup-test-(\d+)-\d+(-raw)?$`)

// newCgroupTree reads the host's cgroup layout and creates the sandbox's directories.
// The leaf in the name=systemd hierarchy is created exclusively: it is what keeps two
// sandboxes (of one test process or of several) from sharing a name.
func newCgroupTree() (*cgroupTree, error) {
	c := &cgroupTree{mounts: map[string]string{}, own: map[string]string{}}
	if err := c.readMounts(); err != nil {
		return nil, err
	}
	parent, err := c.readOwn()
	if err != nil {
		return nil, err
	}
	for _, m := range c.all {
		removeStale(filepath.Join(m, parent))
	}
	for n := 0; ; n++ {
		c.rel = filepath.Join(parent, fmt.Sprintf("vmsup-test-%d-%d", os.Getpid(), n))
		err := c.mkdirAll(c.track, true)
		if errors.Is(err, fs.ErrExist) {
			continue
		} else if err != nil {
			c.remove()
			return nil, err
		}
		break
	}
	for _, m := range c.all {
		if m == c.track {
			continue
		}
		if err := c.mkdirAll(m, false); err != nil {
			c.remove()
			return nil, err
		}
	}
	return c, nil
}

// readMounts finds the cgroup hierarchies mounted under /sys/fs/cgroup.
func (c *cgroupTree) readMounts() error {
	f, err := os.Open("/proc/self/mountinfo")
	if err != nil {
		return err
	}
	defer f.Close()
	v1 := false
	sc := bufio.NewScanner(f)
	for sc.Scan() {
		pre, post, ok := strings.Cut(sc.Text(), " - ")
		fields, tail := strings.Fields(pre), strings.Fields(post)
		if !ok || len(fields) < 5 || len(tail) < 3 || !strings.HasPrefix(fields[4], "/sys/fs/cgroup") {
			continue
		}
		mnt := fields[4]
		switch tail[0] {
		case "cgroup":
			v1 = true
			c.all = append(c.all, mnt)
			c.mounts[filepath.Base(mnt)] = mnt
			for _, o := range strings.Split(tail[2], ",") {
				if o == "name=systemd" {
					c.track = mnt
					c.mounts["systemd"] = mnt
				} else if o != "rw" && o != "ro" && !strings.Contains(o, "=") {
					c.mounts[o] = mnt
				}
			}
		case "cgroup2":
			c.all = append(c.all, mnt)
			c.mounts["unified"] = mnt
		}
	}
	if err := sc.Err(); err != nil {
		return err
	}
	if !v1 || c.track == "" {
		return errors.New("testenv: needs cgroup v1 or hybrid with a name=systemd hierarchy under /sys/fs/cgroup; " +
			"a pure cgroup v2 host would need delegation, which is not implemented")
	}
	return nil
}

// readOwn records this process's cgroup in each hierarchy and returns the parent for
// the sandbox: its memory cgroup (else its name=systemd cgroup).
func (c *cgroupTree) readOwn() (string, error) {
	b, err := os.ReadFile("/proc/self/cgroup")
	if err != nil {
		return "", err
	}
	for _, l := range strings.Split(string(b), "\n") {
		parts := strings.SplitN(l, ":", 3)
		if len(parts) != 3 {
			continue
		}
		for _, ctl := range strings.Split(parts[1], ",") {
			key := strings.TrimPrefix(ctl, "name=")
			if ctl == "" {
				key = "unified"
			}
			if m, ok := c.mounts[key]; ok {
				c.own[m] = parts[2]
			}
		}
	}
	for _, k := range []string{"memory", "systemd"} {
		if p, ok := c.own[c.mounts[k]]; ok {
			return p, nil
		}
	}
	return "/", nil
}

// mkdirAll creates c.rel under mount m and sees that every cpuset level on
// the way has CPUs and memory nodes (cpusetFill). With exclusive, an existing
// leaf is an fs.ErrExist error. A parent that a finishing sandbox removes
// under our feet is created again.
func (c *cgroupTree) mkdirAll(m string, exclusive bool) error {
	var err error
	for try := 0; try < 5; try++ {
		if err = c.mkdirOnce(m, exclusive); !errors.Is(err, fs.ErrNotExist) {
			break
		}
	}
	if err != nil {
		return fmt.Errorf("cgroup: %w", err)
	}
	return nil
}

func (c *cgroupTree) mkdirOnce(m string, exclusive bool) error {
	parts := strings.Split(strings.Trim(c.rel, "/"), "/")
	dir := m
	for i, part := range parts {
		parent := dir
		dir = filepath.Join(dir, part)
		if err := os.Mkdir(dir, 0o755); errors.Is(err, fs.ErrExist) {
			if exclusive && i == len(parts)-1 {
				return err
			}
		} else if err != nil {
			return err
		}
		if err := cpusetFill(parent, dir); err != nil {
			return err
		}
	}
	return nil
}

// cpusetFill gives a cgroup v1 cpuset level its parent's CPUs and memory
// nodes where it has none. A new cpuset level starts empty, and joining a
// cpuset with an empty cpuset.cpus or cpuset.mems fails with ENOSPC ("No
// space left on device"): an existing level counts too, since a run killed
// between its mkdir and its copy, or one racing us for the same parent,
// leaves one empty. Outside a cpuset hierarchy it does nothing.
func cpusetFill(parent, dir string) error {
	for _, f := range []string{"cpuset.cpus", "cpuset.mems"} {
		have, err := os.ReadFile(filepath.Join(dir, f))
		if errors.Is(err, fs.ErrNotExist) {
			continue
		} else if err != nil {
			return err
		}
		if len(bytes.TrimSpace(have)) > 0 {
			continue
		}
		v, err := os.ReadFile(filepath.Join(parent, f))
		if err != nil {
			return err
		}
		if len(bytes.TrimSpace(v)) == 0 {
			return fmt.Errorf("%s: %s is empty and so is its parent's: "+
				"no process can join it (ENOSPC); give %s CPUs and memory nodes, or remove it", dir, f, parent)
		}
		if err := os.WriteFile(filepath.Join(dir, f), v, 0o644); err != nil {
			return fmt.Errorf("%s: %s is empty and could not be given its parent's %q: %w", dir, f, bytes.TrimSpace(v), err)
		}
	}
	return nil
}

// procsFiles are the cgroup.procs files the sandbox's first process must join.
func (c *cgroupTree) procsFiles() []string {
	var files []string
	for _, m := range c.all {
		files = append(files, filepath.Join(m, c.rel, "cgroup.procs"))
	}
	return files
}

// remove deletes the sandbox's directories deepest first (waiting up to 5 s for dying
// processes to leave them), then any parents left empty.
func (c *cgroupTree) remove() error {
	var first error
	for _, m := range c.all {
		for _, d := range []string{c.rel, c.rel + "-raw"} { // -raw: besideDir's
			if err := removeTree(filepath.Join(m, d), 5*time.Second); err != nil && first == nil {
				first = err
			}
		}
	}
	// Parents: ours, or made by a sandbox that stopped while we ran. rmdir fails on a
	// cgroup with processes or children, and this process's own cgroups are never tried.
	for _, m := range c.all {
		for d := filepath.Dir(c.rel); d != "/" && d != "."; d = filepath.Dir(d) {
			if own := c.own[m]; own == d || strings.HasPrefix(own, d+"/") || syscall.Rmdir(filepath.Join(m, d)) != nil {
				break
			}
		}
	}
	return first
}

// removeTree rmdirs dir and every cgroup below it, deepest first.
func removeTree(dir string, wait time.Duration) error {
	var dirs []string
	filepath.WalkDir(dir, func(p string, d fs.DirEntry, err error) error {
		if err == nil && d.IsDir() {
			dirs = append(dirs, p)
		}
		return nil
	})
	sort.Slice(dirs, func(i, j int) bool { return strings.Count(dirs[i], "/") > strings.Count(dirs[j], "/") })
	deadline := time.Now().Add(wait)
	for _, d := range dirs {
		for {
			err := syscall.Rmdir(d)
			if err == nil || errors.Is(err, syscall.ENOENT) {
				break
			}
			if !errors.Is(err, syscall.EBUSY) || time.Now().After(deadline) {
				return fmt.Errorf("cgroup: rmdir %s: %w", d, err)
			}
			time.Sleep(20 * time.Millisecond)
		}
	}
	return nil
}

// removeStale removes empty trees left by sandboxes of test processes that have died.
func removeStale(parent string) {
	ents, _ := os.ReadDir(parent)
	for _, e := range ents {
		m := staleName.FindStringSubmatch(e.Name())
		if m == nil {
			continue
		}
		pid, _ := strconv.Atoi(m[1])
		if syscall.Kill(pid, 0) == syscall.ESRCH {
			removeTree(filepath.Join(parent, e.Name()), 0)
		}
	}
}

// unitDir finds a unit's cgroup (relative to the sandbox root), in any slice.
func (c *cgroupTree) unitDir(unit string) (string, error) {
	root := filepath.Join(c.track, c.rel)
	var found string
	filepath.WalkDir(root, func(p string, d fs.DirEntry, err error) error {
		if err != nil || !d.IsDir() || found != "" {
			return nil
		}
		if d.Name() == unit {
			found = p
			return filepath.SkipAll
		}
		return nil
	})
	if found == "" {
		return "", fmt.Errorf("unit %s: no cgroup under %s: %w", unit, root, fs.ErrNotExist)
	}
	return filepath.Rel(root, found)
}

// procs reads cgroup.procs of dir and every cgroup below it.
func procs(dir string) ([]int, error) {
	var pids []int
	err := filepath.WalkDir(dir, func(p string, d fs.DirEntry, err error) error {
		if err != nil || !d.IsDir() {
			return err
		}
		b, err := os.ReadFile(filepath.Join(p, "cgroup.procs"))
		if errors.Is(err, fs.ErrNotExist) {
			return nil // the cgroup went away while we walked
		} else if err != nil {
			return err
		}
		for _, f := range strings.Fields(string(b)) {
			if pid, err := strconv.Atoi(f); err == nil {
				pids = append(pids, pid)
			}
		}
		return nil
	})
	sort.Ints(pids)
	return pids, err
}

// besideDir creates a cgroup next to the sandbox's (same parent, name
// <sandbox>-raw) in the hierarchy that holds controller, and returns it.
// Not inside the sandbox's tree: the sandbox's systemd owns that tree and
// trims what it did not make as soon as a unit turns on the controller
// (measured: a CPUAccounting unit removed a directory made there, and the
// bench's raw QEMUs could no longer join it).
func (c *cgroupTree) besideDir(controller string) (string, error) {
	m, ok := c.mounts[controller]
	if !ok {
		m, ok = c.mounts["unified"]
	}
	if !ok {
		return "", fmt.Errorf("cgroup: no hierarchy holds %s", controller)
	}
	dir := filepath.Join(m, c.rel+"-raw")
	if err := os.Mkdir(dir, 0o755); err != nil && !errors.Is(err, fs.ErrExist) {
		return "", fmt.Errorf("cgroup: %w", err)
	}
	if _, err := os.Stat(filepath.Join(dir, "cgroup.procs")); err != nil {
		return "", fmt.Errorf("cgroup: %s is not a cgroup: %w", dir, err)
	}
	return dir, nil
}
