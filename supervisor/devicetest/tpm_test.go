package devicetest

import (
	"bytes"
	"context"
	"crypto/sha256"
	"encoding/binary"
	"encoding/hex"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/vmsup/vmsup/internal/dev/testenv"
	"github.com/vmsup/vmsup/supervisor"
	"github.com/vmsup/vmsup/supervisor/supervisortest"
)

// TPM 2.0 commands the guest sends through /dev/tpm0 as raw bytes (the test
// guest has no tpm2-tools): the test's own encoding, from the TPM 2.0
// specification part 3.
const (
	tpmSTNoSessions = 0x8001
	tpmSTSessions   = 0x8002
	tpmRHOwner      = 0x40000001
	tpmRSPW         = 0x40000009 // the password session (empty owner auth)
	tpmAlgSHA256    = 0x000B
	tpmEKHandle     = 0x81010001 // swtpm_setup --createek's RSA EK
	nvIndex         = 0x01500016
	pcrIndex        = 16 // the debug PCR
)

// tpmCommand is a command with its handles and, if auth, one password
// session.
func tpmCommand(cc uint32, handles []uint32, auth bool, params []byte) []byte {
	var b bytes.Buffer
	be := func(v any) { _ = binary.Write(&b, binary.BigEndian, v) }
	tag := uint16(tpmSTNoSessions)
	if auth {
		tag = tpmSTSessions
	}
	be(tag)
	be(uint32(0)) // size, set below
	be(cc)
	for _, h := range handles {
		be(h)
	}
	if auth {
		be(uint32(9))
		be(uint32(tpmRSPW))
		be(uint16(0)) // nonce
		be(uint8(0))  // attributes
		be(uint16(0)) // hmac
	}
	b.Write(params)
	out := b.Bytes()
	binary.BigEndian.PutUint32(out[2:], uint32(len(out)))
	return out
}

func u16(v uint16) []byte { return binary.BigEndian.AppendUint16(nil, v) }
func u32(v uint32) []byte { return binary.BigEndian.AppendUint32(nil, v) }

func pcrExtend(digest [32]byte) []byte {
	p := append(u32(1), u16(tpmAlgSHA256)...)
	return tpmCommand(0x182, []uint32{pcrIndex}, true, append(p, digest[:]...))
}

func nvDefine() []byte {
	pub := append(u32(nvIndex), u16(tpmAlgSHA256)...)
	pub = append(pub, u32(0x00020002)...) // OWNERWRITE | OWNERREAD
	pub = append(pub, u16(0)...)          // no policy
	pub = append(pub, u16(8)...)          // 8 bytes
	p := append(u16(0), u16(uint16(len(pub)))...)
	return tpmCommand(0x12A, []uint32{tpmRHOwner}, true, append(p, pub...))
}

func nvWrite(data []byte) []byte {
	p := append(u16(uint16(len(data))), data...)
	return tpmCommand(0x137, []uint32{tpmRHOwner, nvIndex}, true, append(p, u16(0)...))
}

func nvRead() []byte {
	return tpmCommand(0x14E, []uint32{tpmRHOwner, nvIndex}, true, append(u16(8), u16(0)...))
}

func readPublic(h uint32) []byte { return tpmCommand(0x173, []uint32{h}, false, nil) }

// tpmSend has the guest send cmd to /dev/tpm0 and returns the response.
func tpmSend(t *testing.T, ctx context.Context, sh *testenv.GuestShell, cmd []byte) []byte {
	t.Helper()
	var esc strings.Builder
	for _, c := range cmd {
		fmt.Fprintf(&esc, `\%03o`, c)
	}
	out, _, err := sh.Run(ctx, `( exec 3<>/dev/tpm0; printf '`+esc.String()+`' >&3; dd bs=4096 count=1 <&3 2>/dev/null ) | od -An -v -tx1 | tr -d ' \n'; echo`)
	if err != nil {
		t.Fatal(err)
	}
	resp, err := hex.DecodeString(lastLine(out))
	if err != nil || len(resp) < 10 {
		t.Fatalf("TPM response %q: %v", out, err)
	}
	return resp
}

// tpmOK sends cmd and fails the test unless the TPM answers success.
func tpmOK(t *testing.T, ctx context.Context, sh *testenv.GuestShell, what string, cmd []byte) []byte {
	t.Helper()
	resp := tpmSend(t, ctx, sh, cmd)
	if rc := binary.BigEndian.Uint32(resp[6:]); rc != 0 {
		t.Fatalf("%s: TPM response code 0x%x", what, rc)
	}
	return resp
}

// pcr16 is the guest's view of PCR 16 (SHA-256), through the kernel's sysfs.
func pcr16(t *testing.T, ctx context.Context, sh *testenv.GuestShell) string {
	t.Helper()
	out, _, err := sh.Run(ctx, "cat /sys/class/tpm/tpm0/pcr-sha256/16")
	if err != nil {
		t.Fatal(err)
	}
	return strings.ToLower(lastLine(out))
}

// lastLine is the last non-empty line of a command's output.
func lastLine(out string) string {
	lines := strings.Split(strings.TrimSpace(strings.ReplaceAll(out, "\r", "")), "\n")
	return strings.TrimSpace(lines[len(lines)-1])
}

// TestTPMState: the guest sees /dev/tpm0 from swtpm, extends a PCR and
// writes an NV index; after a local migration it reads the same PCR and NV
// index, and after a down/up the same NV index and endorsement key (the
// PCRs of a rebooted TPM start anew, as on a real machine). swtpm runs as
// QEMU's user in its own unit, and goes with the VM.
func TestTPMState(t *testing.T) {
	if _, err := exec.LookPath("swtpm"); err != nil {
		t.Skip("swtpm is not installed (scripts/install-deps.sh installs it)")
	}
	ctx := supervisortest.Context(t, 6*time.Minute)
	dir := t.TempDir()
	body := fmt.Sprintf(`name = "tpmvm"
memory = "256M"
accel = "tcg"
hotplug_slots = 0
stop_timeout = "20s"

[tpm]

[boot]
kernel = %q
initrd = %q
cmdline = "console=ttyS0 no_timer_check"
`, env.Guest.BzImage, env.Guest.Initrd)
	sup, f := upVM(t, ctx, dir, "tpmvm", body)
	dial := func() *testenv.GuestShell { return shell(t, ctx, status(t, ctx, sup, "tpmvm")) }
	sh := dial()
	checkSwtpmUnit(t, ctx, "vmsup-tpm@tpmvm.service")

	digest := sha256.Sum256([]byte("vmsup"))
	tpmOK(t, ctx, sh, "PCR_Extend", pcrExtend(digest))
	want := sha256.Sum256(append(make([]byte, 32), digest[:]...))
	if got := pcr16(t, ctx, sh); got != hex.EncodeToString(want[:]) {
		t.Fatalf("PCR 16 after one extend: %s, want %x", got, want)
	}
	data := []byte("vmsup-nv")
	tpmOK(t, ctx, sh, "NV_DefineSpace", nvDefine())
	tpmOK(t, ctx, sh, "NV_Write", nvWrite(data))
	readNV := func(when string) {
		t.Helper()
		resp := tpmOK(t, ctx, sh, "NV_Read "+when, nvRead())
		if len(resp) < 24 || !bytes.Equal(resp[16:24], data) {
			t.Errorf("%s: NV index holds %x, want %x (%q)", when, resp, data, data)
		}
	}
	readNV("before")
	ek := tpmOK(t, ctx, sh, "ReadPublic of the EK", readPublic(tpmEKHandle))
	sh.Close()

	if _, err := sup.Migrate(ctx, "tpmvm", supervisor.MigrateOptions{Local: true}); err != nil {
		t.Fatal(err)
	}
	sh = dial()
	if got := pcr16(t, ctx, sh); got != hex.EncodeToString(want[:]) {
		t.Errorf("PCR 16 after a local migration: %s, want %x", got, want)
	}
	readNV("after a local migration")
	checkSwtpmUnit(t, ctx, "vmsup-tpm@tpmvm:migrated.service")
	sh.Close()

	if _, err := sup.Down(ctx, "tpmvm"); err != nil {
		t.Fatal(err)
	}
	for _, u := range []string{"vmsup-tpm@tpmvm.service", "vmsup-tpm@tpmvm:migrated.service"} {
		if st := unitState(t, ctx, u); st != "inactive" {
			t.Errorf("after down: %s is %s", u, st)
		}
	}
	if _, err := sup.Up(ctx, f); err != nil {
		t.Fatal(err)
	}
	sh = dial()
	readNV("after down/up")
	if got := tpmOK(t, ctx, sh, "ReadPublic of the EK after down/up", readPublic(tpmEKHandle)); !bytes.Equal(got, ek) {
		t.Errorf("the endorsement key changed over down/up:\n%x\nwant\n%x", got, ek)
	}
	if got := pcr16(t, ctx, sh); got != strings.Repeat("0", 64) {
		t.Errorf("PCR 16 after a reboot: %s, want zeros (PCRs reset when the TPM starts)", got)
	}
}

// checkSwtpmUnit: swtpm runs as a user of its own (QEMU's), not root,
// with no network.
func checkSwtpmUnit(t *testing.T, ctx context.Context, unit string) {
	t.Helper()
	if st := unitState(t, ctx, unit); st != "active" {
		t.Fatalf("%s is %s", unit, st)
	}
	out, err := env.Systemd.Systemctl(ctx, "show", "-p", "User", "-p", "PrivateNetwork", "-p", "ProtectSystem", unit)
	if err != nil {
		t.Fatal(err)
	}
	for _, want := range []string{"User=vmsupq-", "PrivateNetwork=yes", "ProtectSystem=strict"} {
		if !strings.Contains(string(out), want) {
			t.Errorf("%s: %q lacks %q", unit, out, want)
		}
	}
}

func unitState(t *testing.T, ctx context.Context, unit string) string {
	t.Helper()
	out, err := env.Systemd.Systemctl(ctx, "show", "-p", "ActiveState", "--value", unit)
	if err != nil {
		t.Fatal(err)
	}
	return strings.TrimSpace(string(out))
}

// TestTPMKilledAfterStart: vmsup dies right after it started swtpm, before
// QEMU: the next down stops the swtpm left waiting, and the next up starts
// the VM with its TPM.
func TestTPMKilledAfterStart(t *testing.T) {
	if _, err := exec.LookPath("swtpm"); err != nil {
		t.Skip("swtpm is not installed (scripts/install-deps.sh installs it)")
	}
	ctx := supervisortest.Context(t, 3*time.Minute)
	root, dir := t.TempDir(), t.TempDir()
	body := fmt.Sprintf("name = \"tpmkill\"\nmemory = \"128M\"\naccel = \"tcg\"\nstop_timeout = \"1s\"\n[tpm]\n[boot]\nkernel = %q\n", env.Guest.BzImage)
	f := supervisortest.LoadTOML(t, dir, "tpmkill", body)
	path := f.Path
	sup := supervisortest.New(t, env, root, vmsupBin)
	const swtpm = "vmsup-tpm@tpmkill.service"
	for _, next := range []string{"down", "up"} {
		cmd := exec.CommandContext(ctx, os.Args[0], "-crash-helper", root, env.Systemd.BusAddress, vmsupBin, path, supervisor.StepTPM)
		out, err := cmd.CombinedOutput()
		var ee *exec.ExitError
		if !errors.As(err, &ee) || ee.Sys().(syscall.WaitStatus).Signal() != syscall.SIGKILL {
			t.Fatalf("helper did not die after %s: %v\n%s", supervisor.StepTPM, err, out)
		}
		if st := unitState(t, ctx, swtpm); st != "active" {
			t.Fatalf("killed after %s: %s is %s, want active (left waiting for its QEMU)", supervisor.StepTPM, swtpm, st)
		}
		if next == "up" {
			if _, err := sup.Up(ctx, f); err != nil {
				t.Fatalf("up after a kill: %v", err)
			}
			if st := status(t, ctx, sup, "tpmkill"); st.State != supervisor.StateRunning {
				t.Errorf("after up: %s", st.State)
			}
		}
		if _, err := sup.Down(ctx, "tpmkill"); err != nil {
			t.Fatalf("%s, then down: %v", next, err)
		}
		if st := unitState(t, ctx, swtpm); st != "inactive" {
			t.Errorf("%s after a kill, then down: %s is %s", next, swtpm, st)
		}
	}
}
