package confine

import (
	"bytes"
	"context"
	"fmt"
	"os"
	"strconv"
	"strings"
	"time"

	"github.com/vmsup/vmsup/units"
)

// Status is the confinement in force for a running VM, as systemd, the
// kernel and vmsup's record say.
type Status struct {
	// User QEMU runs as (systemd's User=); UID from /proc when QEMU's
	// process is visible there, else from vmsup's record.
	User string `json:"user"`
	UID  uint32 `json:"uid"`
	// AppArmorMode is the spec's security.apparmor; AppArmor says what is in
	// force: "vmsup-web (enforce)" or "unconfined: <why>".
	AppArmorMode string `json:"apparmor_mode"`
	AppArmor     string `json:"apparmor"`
	// Seccomp: QEMU's own -sandbox filter and the unit's SystemCallFilter=;
	// SeccompFilters is the kernel's count from /proc (0 when not visible).
	Seccomp        string `json:"seccomp"`
	SeccompFilters int    `json:"seccomp_filters,omitempty"`
	// Exposure is systemd-analyze security's figure for the unit.
	Exposure      *units.Exposure `json:"exposure,omitempty"`
	ExposureError string          `json:"exposure_error,omitempty"`
}

// Status reads what confines the running VM: from its unit (sd), its
// process (mainPID), the record, and whether its QEMU runs -sandbox on.
// analyze, when set, measures the unit's exposure (systemd-analyze).
func (m *Manager) Status(ctx context.Context, sd *units.Manager, name, unit string, mainPID uint32, sandboxOn bool,
	analyze func(context.Context) (units.Exposure, error)) *Status {
	c := &Status{}
	rec, recErr := m.Read(name)
	if recErr == nil {
		c.AppArmorMode, c.UID = rec.AppArmor.Mode, rec.UID
	}
	sec, err := sd.Security(ctx, unit)
	if err == nil {
		c.User = sec.User
	}
	if c.User == "" {
		c.User = "root"
	}
	switch {
	case sec.AppArmorProfile != "":
		c.AppArmor = sec.AppArmorProfile + " (" + profileMode(sec.AppArmorProfile) + ")"
	case recErr == nil && rec.AppArmor.Reason != "":
		c.AppArmor = "unconfined: " + rec.AppArmor.Reason
	default:
		c.AppArmor = "unconfined"
	}
	var parts []string
	if sandboxOn {
		parts = append(parts, "qemu -sandbox on")
	} else {
		parts = append(parts, "qemu -sandbox off")
	}
	if sec.SyscallFilter {
		parts = append(parts, "systemd SystemCallFilter")
	}
	if sec.NoNewPrivileges {
		parts = append(parts, "NoNewPrivileges")
	}
	c.Seccomp = strings.Join(parts, " + ")
	if uid, filters, ok := qemuProc(mainPID, name); ok {
		c.UID, c.SeccompFilters = uid, filters
	}
	if analyze == nil {
		c.ExposureError = "not measured"
		return c
	}
	actx, cancel := context.WithTimeout(ctx, 10*time.Second)
	defer cancel()
	if e, err := analyze(actx); err == nil {
		c.Exposure = &e
	} else {
		c.ExposureError = err.Error()
	}
	return c
}

// qemuProc reads uid and seccomp filter count of pid from /proc if it is
// this VM's QEMU (MainPID is in systemd's PID namespace, which may not be
// ours).
func qemuProc(pid uint32, name string) (uid uint32, filters int, ok bool) {
	if pid == 0 {
		return 0, 0, false
	}
	dir := "/proc/" + strconv.Itoa(int(pid))
	cmd, err := os.ReadFile(dir + "/cmdline")
	if err != nil || !bytes.Contains(cmd, []byte("\x00guest="+name+",")) {
		return 0, 0, false
	}
	st, err := os.ReadFile(dir + "/status")
	if err != nil {
		return 0, 0, false
	}
	for _, l := range strings.Split(string(st), "\n") {
		f := strings.Fields(l)
		switch {
		case len(f) >= 2 && f[0] == "Uid:":
			u, _ := strconv.ParseUint(f[1], 10, 32)
			uid = uint32(u)
		case len(f) >= 2 && f[0] == "Seccomp_filters:":
			filters, _ = strconv.Atoi(f[1])
		}
	}
	return uid, filters, true
}

// profileMode looks the profile up in the kernel's list.
func profileMode(name string) string {
	b, err := os.ReadFile("/sys/kernel/security/apparmor/profiles")
	if err != nil {
		return "not visible: " + err.Error()
	}
	for _, l := range strings.Split(string(b), "\n") {
		if strings.HasPrefix(l, name+" (") {
			return strings.TrimSuffix(strings.TrimPrefix(l, name+" ("), ")")
		}
	}
	return "not loaded"
}

// String is the one-line form status prints.
func (c *Status) String() string {
	exp := "exposure unknown (" + c.ExposureError + ")"
	if c.Exposure != nil {
		exp = fmt.Sprintf("exposure %.1f %s", c.Exposure.Level, c.Exposure.Rating)
	}
	return fmt.Sprintf("user %s (uid %d); apparmor %s [%s]; seccomp %s; %s", c.User, c.UID, c.AppArmor, c.AppArmorMode, c.Seccomp, exp)
}
