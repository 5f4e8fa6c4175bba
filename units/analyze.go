package units

import (
	"context"
	"fmt"
	"os"
	"os/exec"
	"regexp"
	"strconv"
	"strings"
)

// Exposure is systemd-analyze security's verdict on a unit.
type Exposure struct {
	Level  float64 `json:"level"`  // 0.0 (locked down) .. 10.0 (unprotected)
	Rating string  `json:"rating"` // "OK", "MEDIUM", "EXPOSED", "UNSAFE"
	// Open lists the checks that still count against the unit ("✗" lines).
	Open []string `json:"open,omitempty"`
}

var overallRE = regexp.MustCompile(`Overall exposure level for \S+: ([0-9.]+) (\S+)`)

// AnalyzeSecurity runs `systemd-analyze security UNIT` through analyze (the
// command and its leading arguments, e.g. {"systemd-analyze"} or an nsenter
// prefix for a systemd in another namespace; nil means "systemd-analyze"
// with DBUS_SYSTEM_BUS_ADDRESS=bus when bus is set).
func AnalyzeSecurity(ctx context.Context, analyze []string, bus, unit string) (Exposure, error) {
	if len(analyze) == 0 {
		analyze = []string{"systemd-analyze"}
	}
	cmd := exec.CommandContext(ctx, analyze[0], append(analyze[1:], "security", "--no-pager", unit)...)
	cmd.Env = append(os.Environ(), "SYSTEMD_COLORS=0", "SYSTEMD_PAGER=")
	if bus != "" {
		cmd.Env = append(cmd.Env, "DBUS_SYSTEM_BUS_ADDRESS="+bus)
	}
	out, err := cmd.CombinedOutput()
	m := overallRE.FindSubmatch(out)
	if m == nil {
		if err == nil {
			err = fmt.Errorf("no overall exposure line")
		}
		return Exposure{}, fmt.Errorf("systemd-analyze security %s: %w: %s", unit, err, lastLine(string(out)))
	}
	e := Exposure{Rating: string(m[2])}
	e.Level, _ = strconv.ParseFloat(string(m[1]), 64)
	for _, l := range strings.Split(string(out), "\n") {
		if f := strings.Fields(l); len(f) > 1 && f[0] == "✗" {
			e.Open = append(e.Open, f[1])
		}
	}
	return e, nil
}

func lastLine(s string) string {
	s = strings.TrimSpace(s)
	if i := strings.LastIndexByte(s, '\n'); i >= 0 {
		return s[i+1:]
	}
	return s
}
