package devicetest

import (
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
	"time"

	diskfs "github.com/diskfs/go-diskfs"
	"github.com/diskfs/go-diskfs/disk"
	"github.com/diskfs/go-diskfs/filesystem"
	"github.com/diskfs/go-diskfs/partition/gpt"

	"github.com/vmsup/vmsup/internal/dev/testenv"
	"github.com/vmsup/vmsup/supervisor/supervisortest"
)

// Debian's ovmf ships a test key enrolled in a variable store of its own.
const (
	snakeoilVars = "/usr/share/OVMF/OVMF_VARS_4M.snakeoil.fd"
	snakeoilKey  = "/usr/share/ovmf/PkKek-1-snakeoil.key" // its passphrase: "snakeoil"
	snakeoilCert = "/usr/share/ovmf/PkKek-1-snakeoil.pem"
)

// TestSecureBoot: a VM with secure_boot and the snakeoil keys boots from
// two EFI system partitions in order: the firmware refuses the guest
// kernel without a signature, then starts the same kernel signed with the
// enrolled key, whose EFI stub reports Secure Boot enabled; status shows
// the store enforcing and its enrolled certificates.
func TestSecureBoot(t *testing.T) {
	for _, f := range []string{snakeoilVars, snakeoilKey, snakeoilCert, "/usr/share/OVMF/OVMF_CODE_4M.secboot.fd"} {
		if _, err := os.Stat(f); err != nil {
			t.Skipf("%v (apt-get install ovmf)", err)
		}
	}
	for _, b := range []string{"sbsign", "sbattach", "openssl"} {
		if _, err := exec.LookPath(b); err != nil {
			t.Skipf("%s is not installed (apt-get install sbsigntool openssl)", b)
		}
	}
	ctx := supervisortest.Context(t, 5*time.Minute)
	dir := t.TempDir()
	unsigned, signed := signKernel(t, dir)
	for name, kernel := range map[string]string{"unsigned.raw": unsigned, "signed.raw": signed} {
		espImage(t, filepath.Join(dir, name), kernel)
	}
	body := fmt.Sprintf(`name = "sbvm"
memory = "256M"
accel = "tcg"
hotplug_slots = 0
stop_timeout = "5s"

[boot]
firmware = "uefi"
secure_boot = true
vars_template = %q

[[disk]]
name = "unsigned"
file = "unsigned.raw"
boot_index = 1

[[disk]]
name = "signed"
file = "signed.raw"
boot_index = 2
`, snakeoilVars)
	sup, _ := upVM(t, ctx, dir, "sbvm", body)
	st := status(t, ctx, sup, "sbvm")
	testenv.WaitLog(t, st.ConsoleLog, "EFI stub: UEFI Secure Boot is enabled.", 2*time.Minute)
	log, _ := os.ReadFile(st.ConsoleLog)
	// OVMF's boot manager names each boot option it tries; the first one's
	// image is refused before the second one's kernel runs.
	text := strings.ReplaceAll(string(log), "\x1b", "")
	refused := strings.Index(text, "Access Denied")
	started := strings.Index(text, "EFI stub:")
	if refused < 0 || refused > started {
		t.Errorf("the unsigned kernel was not refused before the signed one started; console:\n%s", supervisortest.Tail(text, 3000))
	}
	sb := st.SecureBoot
	if sb == nil || !sb.Enforced || len(sb.Certs) != 3 || !strings.Contains(sb.Certs[0].Subject, "SnakeOil") || sb.Warning != "" {
		t.Errorf("status: secure boot %+v, want enforced with the snakeoil PK, KEK and db", sb)
	}
}

// signKernel makes the guest's kernel without Debian's signature, and the
// same signed with the snakeoil key.
func signKernel(t *testing.T, dir string) (unsigned, signed string) {
	t.Helper()
	unsigned, signed = filepath.Join(dir, "vmlinuz.unsigned"), filepath.Join(dir, "vmlinuz.signed")
	key := filepath.Join(dir, "snakeoil.key")
	b, err := os.ReadFile(env.Guest.BzImage)
	if err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(unsigned, b, 0o644); err != nil {
		t.Fatal(err)
	}
	for _, argv := range [][]string{
		{"sbattach", "--remove", unsigned},
		{"openssl", "rsa", "-in", snakeoilKey, "-passin", "pass:snakeoil", "-out", key},
		{"sbsign", "--key", key, "--cert", snakeoilCert, "--output", signed, unsigned},
	} {
		if out, err := exec.Command(argv[0], argv[1:]...).CombinedOutput(); err != nil {
			t.Fatalf("%s: %v\n%s", strings.Join(argv, " "), err, out)
		}
	}
	return unsigned, signed
}

// espImage writes a disk image with a GPT and an EFI system partition
// holding kernel as the removable-media boot loader (EFI/BOOT/BOOTX64.EFI).
func espImage(t *testing.T, path, kernel string) {
	t.Helper()
	const size = 48 << 20
	d, err := diskfs.Create(path, size, diskfs.SectorSizeDefault)
	if err != nil {
		t.Fatal(err)
	}
	defer d.Close()
	table := &gpt.Table{ProtectiveMBR: true, LogicalSectorSize: 512, PhysicalSectorSize: 512, Partitions: []*gpt.Partition{{Start: 2048, End: size/512 - 2048, Type: gpt.EFISystemPartition, Name: "ESP"}}}
	if err := d.Partition(table); err != nil {
		t.Fatal(err)
	}
	fs, err := d.CreateFilesystem(disk.FilesystemSpec{Partition: 1, FSType: filesystem.TypeFat32, VolumeLabel: "ESP"})
	if err != nil {
		t.Fatal(err)
	}
	if err := fs.Mkdir("/EFI/BOOT"); err != nil {
		t.Fatal(err)
	}
	w, err := fs.OpenFile("/EFI/BOOT/BOOTX64.EFI", os.O_CREATE|os.O_RDWR)
	if err != nil {
		t.Fatal(err)
	}
	b, err := os.ReadFile(kernel)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := w.Write(b); err != nil {
		t.Fatal(err)
	}
	if err := w.Close(); err != nil {
		t.Fatal(err)
	}
}
