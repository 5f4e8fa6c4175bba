package qemuargs

import (
	"bytes"
	"context"
	"net"
	"strings"
	"testing"
	"time"
)

// TestGoldenArgsBootGuest boots the direct-kernel-boot goldens that have an
// initrd with the real test guest (scripts/build-guest.sh, or
// VMSUP_TEST_GUEST_KERNEL/_INITRD) under TCG, and waits for the guest's
// marker on the serial console: the layout, firmware choice and -append
// quoting work for a running guest, not only for QEMU's parser. Guests boot
// under TCG because this host's KVM (PVM) cannot run a stock kernel.
func TestGoldenArgsBootGuest(t *testing.T) {
	env := needQEMU(t)
	env.kernel, env.initrd = findKernel(t)
	if env.kernel == "" || !exists(env.initrd) {
		t.Skip("no guest kernel and initrd: run scripts/build-guest.sh or set VMSUP_TEST_GUEST_KERNEL and VMSUP_TEST_GUEST_INITRD")
	}
	sem := make(chan struct{}, 2)
	for _, c := range loadCases(t, goldenDir) {
		f, err := c.parse()
		if err != nil || f.VM.Boot.Initrd == "" {
			continue
		}
		wantVDA := len(f.VM.Disks) > 0 && !strings.Contains(f.VM.Boot.Cmdline, "quiet")
		t.Run(c.name, func(t *testing.T) {
			t.Parallel()
			sem <- struct{}{}
			defer func() { <-sem }()
			argv, o := materialize(t, c, env, true)
			ctx, cancel := context.WithTimeout(context.Background(), 40*time.Second)
			defer cancel()
			p, q := startQEMU(ctx, t, argv, o.QMPSocket)
			console, err := readUntil(ctx, o.ConsoleSocket, "VMSUP-GUEST-READY")
			if err != nil {
				p.fail("console: %v\n%s", err, console)
			}
			if wantVDA && !strings.Contains(console, "[vda]") {
				p.fail("the guest found no virtio disk:\n%s", console)
			}
			p.quit(ctx, q)
		})
	}
}

// readUntil reads the unix socket at path until marker or ctx's deadline and
// returns what it read.
func readUntil(ctx context.Context, path, marker string) (string, error) {
	var d net.Dialer
	conn, err := d.DialContext(ctx, "unix", path)
	if err != nil {
		return "", err
	}
	defer conn.Close()
	if dl, ok := ctx.Deadline(); ok {
		conn.SetReadDeadline(dl)
	}
	var got bytes.Buffer
	buf := make([]byte, 4096)
	for !bytes.Contains(got.Bytes(), []byte(marker)) {
		n, err := conn.Read(buf)
		got.Write(buf[:n])
		if err != nil {
			return got.String(), err
		}
	}
	return got.String(), nil
}
