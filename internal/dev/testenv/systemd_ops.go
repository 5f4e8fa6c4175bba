package testenv

import (
	"bytes"
	"context"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"sort"
	"strconv"
	"strings"

	sdbus "github.com/coreos/go-systemd/v22/dbus"
)

// Dial connects go-systemd to the sandbox's systemd. Close the connection when done.
func (s *Systemd) Dial(ctx context.Context) (*sdbus.Conn, error) {
	if err := ctx.Err(); err != nil {
		return nil, err
	}
	c, err := sdbus.NewConnection(s.dialBus)
	if err != nil {
		return nil, fmt.Errorf("testenv: dial %s: %w", s.BusAddress, err)
	}
	return c, nil
}

// Systemctl runs systemctl inside the sandbox and returns its combined output.
func (s *Systemd) Systemctl(ctx context.Context, args ...string) ([]byte, error) {
	return s.nsenter(ctx, append([]string{"systemctl", "--no-pager"}, args...)...)
}

func (s *Systemd) nsenter(ctx context.Context, argv ...string) ([]byte, error) {
	cmd := exec.CommandContext(ctx, "nsenter", append([]string{"-t", strconv.Itoa(s.PID1), "-m", "-p", "--"}, argv...)...)
	cmd.Env = append(os.Environ(), "SYSTEMD_COLORS=0", "SYSTEMD_PAGER=")
	out, err := cmd.CombinedOutput()
	if err != nil {
		return out, fmt.Errorf("testenv: %s in sandbox: %w: %s", strings.Join(argv, " "), err, bytes.TrimSpace(out))
	}
	return out, nil
}

// Journal returns the messages of unit (journalctl -o cat) logged so far.
func (s *Systemd) Journal(ctx context.Context, unit string) (string, error) {
	cmd := exec.CommandContext(ctx, "journalctl", "-D", s.JournalDir, "-u", unit, "-o", "cat", "--no-pager")
	var stderr bytes.Buffer
	cmd.Stderr = &stderr
	out, err := cmd.Output()
	if err != nil {
		return string(out), fmt.Errorf("testenv: journal of %s: %w: %s", unit, err, bytes.TrimSpace(stderr.Bytes()))
	}
	return string(out), nil
}

// HostPIDs returns the host PIDs of the processes in unit's cgroup (and below it),
// wherever the unit's slice is. A unit without a cgroup yields an fs.ErrNotExist error.
func (s *Systemd) HostPIDs(unit string) ([]int, error) {
	rel, err := s.cg.unitDir(unit)
	if err != nil {
		return nil, err
	}
	return procs(filepath.Join(s.cg.track, s.cg.rel, rel))
}

// BesideCgroup returns a cgroup of its own next to the sandbox's, in the
// hierarchy that holds controller ("cpu", "memory", ...; cgroup v2's one
// tree when there is no such v1 hierarchy): for processes a test runs
// outside systemd but wants measured like the sandbox's. Stop removes it.
func (s *Systemd) BesideCgroup(controller string) (string, error) {
	return s.cg.besideDir(controller)
}

// CgroupDir returns the host directory of unit's cgroup in a hierarchy named by a
// controller ("memory", "pids", "cpu", ...), "systemd" or "unified". systemd creates
// a controller's directory only when the unit uses that controller.
func (s *Systemd) CgroupDir(hierarchy, unit string) (string, error) {
	m, ok := s.cg.mounts[hierarchy]
	if !ok {
		return "", fmt.Errorf("testenv: no cgroup hierarchy %q", hierarchy)
	}
	rel, err := s.cg.unitDir(unit)
	if err != nil {
		return "", err
	}
	return filepath.Join(m, s.cg.rel, rel), nil
}

// tail returns the last n lines of a file, for error messages.
func tail(path string, n int) string {
	b, err := os.ReadFile(path)
	if err != nil {
		return err.Error()
	}
	lines := strings.Split(strings.TrimRight(string(b), "\n"), "\n")
	if len(lines) > n {
		lines = lines[len(lines)-n:]
	}
	return strings.Join(lines, "\n")
}

// volatileProps are the properties that change while a unit runs whatever
// it was made with: times, counters, what a daemon-reload itself changes.
var volatileProps = regexp.MustCompile(`^(InvocationID|NeedDaemonReload|.*Timestamp(Monotonic)?|MemoryCurrent|MemoryAvailable|CPUUsageNSec|TasksCurrent|IO(Read|Write)(Bytes|Operations)|IP(In|E)gress(Bytes|Packets)|Effective(CPUs|MemoryNodes))$`)

// execRuntime are the fields of an Exec*= property that say how its
// command last ran, not what it is.
var execRuntime = regexp.MustCompile(` ; (start_time|stop_time|pid|code|status)=(\[[^]]*\]|[^ ;]*)`)

// setProps are the properties systemd keeps as sets (or hash maps) and
// prints on one line in an order that can change at a daemon-reload
// ("0.0.0.0/0 ::/0" before, "::/0 0.0.0.0/0" after): compared as sets.
var setProps = map[string]bool{
	"After": true, "Before": true, "Requires": true, "Wants": true, "BindsTo": true, "RequiredBy": true,
	"WantedBy": true, "Conflicts": true, "ConflictedBy": true, "RequiresMountsFor": true, "PartOf": true,
	"IPAddressAllow": true, "IPAddressDeny": true, "RestrictAddressFamilies": true, "SystemCallFilter": true,
	"SystemCallArchitectures": true, "SystemCallLog": true, "RestrictFileSystems": true, "RestrictNetworkInterfaces": true,
	"CapabilityBoundingSet": true, "AmbientCapabilities": true, "SupplementaryGroups": true,
	"ReadWritePaths": true, "ReadOnlyPaths": true, "InaccessiblePaths": true, "ExecPaths": true, "NoExecPaths": true,
	"BindPaths": true, "BindReadOnlyPaths": true, "TemporaryFileSystem": true,
}

// setWords splits a set's one-line form into its members; a leading "~"
// (a deny list) stays a member of its own so a reordering cannot move it.
func setWords(v string) []string {
	if rest, ok := strings.CutPrefix(v, "~"); ok {
		return append(strings.Fields(rest), "~")
	}
	return strings.Fields(v)
}

// UnitProperties is `systemctl show --all UNIT` as a map of what the unit
// is, not how it runs now (no times, counters or the Exec*= commands' last
// run), with a property given on several lines, a list of units or a set
// (setProps), in sorted order: two snapshots of a unit differ only where
// the unit does.
func (s *Systemd) UnitProperties(ctx context.Context, unit string) (map[string]string, error) {
	out, err := s.Systemctl(ctx, "show", "--all", unit)
	if err != nil {
		return nil, err
	}
	return unitProperties(string(out)), nil
}

// unitProperties is UnitProperties' reading of `systemctl show` output.
func unitProperties(out string) map[string]string {
	lines := map[string][]string{}
	for _, l := range strings.Split(out, "\n") {
		k, v, ok := strings.Cut(l, "=")
		if !ok || volatileProps.MatchString(k) {
			continue
		}
		if strings.HasPrefix(k, "Exec") {
			v = execRuntime.ReplaceAllString(v, "")
		}
		lines[k] = append(lines[k], v)
	}
	m := map[string]string{}
	for k, vs := range lines {
		if setProps[k] && len(vs) == 1 {
			vs = setWords(vs[0])
		}
		sort.Strings(vs)
		m[k] = strings.Join(vs, "\n")
	}
	return m
}
