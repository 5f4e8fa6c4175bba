package units

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"io/fs"
	"os"
	"path/filepath"
	"strings"
	"time"

	"github.com/google/renameio/v2"
	"github.com/vmsup/vmsup/internal/util/atomicfile"
)

// BootUnit is a persistent unit file that systemd runs at every boot, unlike
// the VMs' transient units, which end with the boot they were started in.
// vmsup installs one to bring the VMs marked for autostart up.
type BootUnit struct {
	Name        string // e.g. "vmsup-autostart.service"
	Description string
	ExecStart   []string
	Wants       []string // pulled in and ordered before this unit
	After       []string // ordered before this unit if they run at all
	Timeout     time.Duration
	// WantedBy is the target whose .wants/ directory links the unit:
	// installing it there is what "systemctl enable" does.
	WantedBy string
}

// Render returns the unit file: a oneshot that stays "active (exited)"
// once its command succeeded, so it runs once per boot.
func (b BootUnit) Render() ([]byte, error) {
	if !strings.HasSuffix(b.Name, ".service") || strings.ContainsAny(b.Name, "/\n") {
		return nil, fmt.Errorf("boot unit name %q must be a file name ending in .service", b.Name)
	}
	if len(b.ExecStart) == 0 || b.WantedBy == "" {
		return nil, fmt.Errorf("boot unit %s: needs a command and a target", b.Name)
	}
	cmd, err := ExecLine(b.ExecStart)
	if err != nil {
		return nil, fmt.Errorf("boot unit %s: %w", b.Name, err)
	}
	var w bytes.Buffer
	w.WriteString("# Written by vmsup (vmsup enable/disable); edits are overwritten.\n[Unit]\n")
	fmt.Fprintf(&w, "Description=%s\n", oneLine(b.Description))
	if len(b.Wants) > 0 {
		fmt.Fprintf(&w, "Wants=%s\n", strings.Join(b.Wants, " "))
	}
	if after := append(append([]string{}, b.Wants...), b.After...); len(after) > 0 {
		fmt.Fprintf(&w, "After=%s\n", strings.Join(after, " "))
	}
	w.WriteString("\n[Service]\nType=oneshot\nRemainAfterExit=yes\n")
	fmt.Fprintf(&w, "ExecStart=%s\n", cmd)
	if b.Timeout > 0 {
		fmt.Fprintf(&w, "TimeoutStartSec=%dms\n", b.Timeout.Milliseconds())
	}
	fmt.Fprintf(&w, "\n[Install]\nWantedBy=%s\n", b.WantedBy)
	return w.Bytes(), nil
}

// execArg quotes one command-line word for a unit file: systemd splits
// ExecStart= at spaces, unquotes "..." with C escapes, and expands %
// specifiers and $VARIABLES, so each of those is escaped.
func execArg(a string) (string, error) {
	if a == "" || strings.ContainsAny(a, "\n\r\x00") {
		return "", fmt.Errorf("command word %q cannot be written in a unit file", a)
	}
	a = strings.ReplaceAll(a, "%", "%%")
	a = strings.ReplaceAll(a, "$", "$$")
	if !strings.ContainsAny(a, " \t\"'\\;") {
		return a, nil
	}
	a = strings.ReplaceAll(a, `\`, `\\`)
	a = strings.ReplaceAll(a, `"`, `\"`)
	return `"` + a + `"`, nil
}

// ExecLine is argv as one ExecStart= value, each word quoted for systemd
// (execArg): what a persistent unit vmsup writes runs exactly argv.
func ExecLine(argv []string) (string, error) {
	words := make([]string, len(argv))
	for i, a := range argv {
		q, err := execArg(a)
		if err != nil {
			return "", err
		}
		words[i] = q
	}
	return strings.Join(words, " "), nil
}

func oneLine(s string) string { return strings.Join(strings.Fields(s), " ") }

// Install writes the unit file into dir (e.g. /etc/systemd/system) and links
// it from dir/WantedBy.wants/, as "systemctl enable" does. It reports whether
// anything changed, in which case systemd must reload (Manager.Reload).
func (b BootUnit) Install(dir string) (changed bool, err error) {
	body, err := b.Render()
	if err != nil {
		return false, err
	}
	path := filepath.Join(dir, b.Name)
	if old, err := os.ReadFile(path); err != nil || !bytes.Equal(old, body) {
		if err := os.MkdirAll(dir, 0o755); err != nil {
			return false, err
		}
		if err := atomicfile.WriteFile(path, body, 0o644); err != nil {
			return false, fmt.Errorf("write %s: %w", path, err)
		}
		changed = true
	}
	wants := filepath.Join(dir, b.WantedBy+".wants")
	link := filepath.Join(wants, b.Name)
	if t, err := os.Readlink(link); err == nil && t == path {
		return changed, nil
	}
	if err := os.MkdirAll(wants, 0o755); err != nil {
		return changed, err
	}
	if err := renameio.Symlink(path, link); err != nil {
		return changed, fmt.Errorf("enable %s: %w", b.Name, err)
	}
	return true, nil
}

// Uninstall removes what Install wrote; a missing file is not an error.
func (b BootUnit) Uninstall(dir string) (changed bool, err error) {
	for _, p := range []string{filepath.Join(dir, b.WantedBy+".wants", b.Name), filepath.Join(dir, b.Name)} {
		switch err := os.Remove(p); {
		case err == nil:
			changed = true
		case !errors.Is(err, fs.ErrNotExist):
			return changed, err
		}
	}
	return changed, nil
}

// Reload makes systemd read its unit files again (systemctl daemon-reload).
func (m *Manager) Reload(ctx context.Context) error {
	if err := m.conn.ReloadContext(ctx); err != nil {
		return fmt.Errorf("systemd daemon-reload: %w", err)
	}
	return nil
}
