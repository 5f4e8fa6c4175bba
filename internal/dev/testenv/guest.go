package testenv

import (
	"context"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"time"
)

// Lines and prefixes the test guest prints on its console (ttyS0).
const (
	// ReadyMarker: modules loaded, acpid and (if a port exists) qemu-ga started.
	ReadyMarker = "VMSUP-GUEST-READY"
	// ShellMarker: printed right before the interactive shell on the console starts.
	ShellMarker = "VMSUP-SHELL-READY"
	// CounterPrefix starts each "VMSUP-COUNTER <n> <n>" line (kernel word vmsup.counter).
	CounterPrefix = "VMSUP-COUNTER "
	// NetReadyPrefix starts "VMSUP-NET-READY eth0 ADDR/PREFIX" (vmsup.ip= or vmsup.dhcp).
	NetReadyPrefix = "VMSUP-NET-READY "
)

// DefaultGuestDir is where Guest caches the image unless $VMSUP_GUEST_DIR says otherwise.
const DefaultGuestDir = "/var/cache/vmsup/guest"

// guestDir is where Guest caches the image.
func guestDir() string {
	if dir := os.Getenv("VMSUP_GUEST_DIR"); dir != "" {
		return dir
	}
	return DefaultGuestDir
}

// GuestImage is a bootable test guest: pass Kernel to -kernel and Initrd to -initrd,
// with "console=ttyS0 no_timer_check" on the kernel command line (no_timer_check: under TCG on a
// loaded host the kernel's IO-APIC timer check can miss its ticks and panic, "IO-APIC + timer
// doesn't work", as a fleet test guest did in a full run). The kernel is an uncompressed ELF
// (PVH entry); it boots under TCG (-accel tcg -cpu max) in a few seconds.
type GuestImage struct {
	Kernel string // vmlinux: boots fastest (PVH)
	Initrd string
	// BzImage is the same kernel as Debian ships it, an EFI binary with
	// the Linux boot protocol: for UEFI, and for a TPM under SeaBIOS
	// (whose TPM set-up leaves a PVH-booted guest without ACPI).
	BzImage string
}

// Guest builds the test guest if needed (scripts/build-guest.sh, cached by the script's
// hash) and returns its paths. A cold build downloads the Debian kernel package (~70 MB).
func Guest(ctx context.Context) (GuestImage, error) {
	root, err := RepoRoot()
	if err != nil {
		return GuestImage{}, err
	}
	dir := guestDir()
	script := filepath.Join(root, "scripts", "build-guest.sh")
	out, err := exec.CommandContext(ctx, "bash", script, dir).CombinedOutput()
	if err != nil {
		return GuestImage{}, fmt.Errorf("build guest into %s: %w\n%s", dir, err, out)
	}
	g := GuestImage{Kernel: filepath.Join(dir, "vmlinux"), Initrd: filepath.Join(dir, "initramfs.cpio.gz"),
		BzImage: filepath.Join(dir, "vmlinuz")}
	for _, f := range []string{g.Kernel, g.Initrd, g.BzImage} {
		if _, err := os.Stat(f); err != nil {
			return GuestImage{}, fmt.Errorf("build guest: %w", err)
		}
	}
	return g, nil
}

// RepoRoot returns the directory holding go.mod, found by walking up from the working
// directory (go test runs each package in its own directory).
func RepoRoot() (string, error) {
	dir, err := os.Getwd()
	if err != nil {
		return "", err
	}
	for {
		if _, err := os.Stat(filepath.Join(dir, "go.mod")); err == nil {
			return dir, nil
		} else if !errors.Is(err, os.ErrNotExist) {
			return "", err
		}
		parent := filepath.Dir(dir)
		if parent == dir {
			return "", errors.New("testenv: no go.mod above the working directory")
		}
		dir = parent
	}
}

// BuildVmsup builds the vmsup CLI (cmd/vmsup) into dir and returns its path:
// the binary the VM units call for their stop hooks and the CLI tests run.
func BuildVmsup(ctx context.Context, dir string) (string, error) {
	root, err := RepoRoot()
	if err != nil {
		return "", err
	}
	bin := filepath.Join(dir, "vmsup")
	cmd := exec.CommandContext(ctx, "go", "build", "-o", bin, "./cmd/vmsup")
	cmd.Dir = root
	if out, err := cmd.CombinedOutput(); err != nil {
		return "", fmt.Errorf("testenv: build vmsup: %v\n%s", err, out)
	}
	return bin, nil
}

// BuildDeb builds vmsup's Debian package (scripts/build-deb.sh) into dir
// and returns its path.
func BuildDeb(ctx context.Context, dir string) (string, error) {
	root, err := RepoRoot()
	if err != nil {
		return "", err
	}
	cmd := exec.CommandContext(ctx, "bash", filepath.Join(root, "scripts", "build-deb.sh"), dir)
	var stderr strings.Builder
	cmd.Stderr = &stderr
	out, err := cmd.Output()
	if err != nil {
		return "", fmt.Errorf("testenv: scripts/build-deb.sh: %v\n%s", err, stderr.String())
	}
	return strings.TrimSpace(string(out)), nil
}

// BuildImage runs scripts/SCRIPT with dir (at once when its cached image
// is fresh; a cold build downloads and takes minutes, bounded by timeout)
// and returns why there is no image, "" when there is one: the real guest's
// and the real host's test packages skip with that reason.
func BuildImage(script, dir, what string, timeout time.Duration) (why string) {
	root, err := RepoRoot()
	if err != nil {
		return err.Error()
	}
	ctx, cancel := context.WithTimeout(context.Background(), timeout)
	defer cancel()
	out, err := exec.CommandContext(ctx, "bash", filepath.Join(root, "scripts", script), dir).CombinedOutput()
	if err != nil {
		lines := strings.Split(strings.TrimSpace(string(out)), "\n")
		return fmt.Sprintf("scripts/%s could not build %s into %s (%v): %s",
			script, what, dir, err, strings.Join(lines[max(0, len(lines)-5):], " | "))
	}
	return ""
}
