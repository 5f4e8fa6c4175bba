package testenv

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"sync"
	"time"
)

// TGT is a real iSCSI target: Debian's tgtd, listening on 127.0.0.1 only,
// with a private control socket (-C) so that parallel test packages never
// reach each other's target. Start it with StartTGT and Stop it after.
type TGT struct {
	Portal string // "127.0.0.1:PORT"
	ctl    string // control socket number for tgtadm -C
	cmd    *exec.Cmd
	exited chan struct{}
	log    *bytes.Buffer

	mu       sync.Mutex
	tids     []int
	accounts map[string]bool // CHAP accounts are global in tgtd: created once
}

// StartTGT starts tgtd on a free loopback port. It fails with the reason
// when tgt is not installed (scripts/install-deps.sh installs it).
func StartTGT(ctx context.Context, dir string) (*TGT, error) {
	bin, err := exec.LookPath("tgtd")
	if err != nil {
		return nil, fmt.Errorf("testenv: tgtd not found (apt-get install tgt): %w", err)
	}
	if _, err := exec.LookPath("tgtadm"); err != nil {
		return nil, fmt.Errorf("testenv: tgtadm not found (apt-get install tgt): %w", err)
	}
	if err := os.MkdirAll(dir, 0o700); err != nil {
		return nil, err
	}
	port, err := freePort()
	if err != nil {
		return nil, err
	}
	t := &TGT{Portal: net.JoinHostPort("127.0.0.1", strconv.Itoa(port)), ctl: strconv.Itoa(port % 32768), // tgtd takes 0..32767
		exited: make(chan struct{}), log: &bytes.Buffer{}}
	t.cmd = exec.Command(bin, "-f", "-C", t.ctl, "-p", filepath.Join(dir, "tgtd.pid"), "--iscsi", "portal="+t.Portal)
	t.cmd.Dir = dir
	t.cmd.Stdout, t.cmd.Stderr = t.log, t.log
	if err := t.cmd.Start(); err != nil {
		return nil, fmt.Errorf("testenv: start tgtd: %w", err)
	}
	go func() { t.cmd.Wait(); close(t.exited) }()
	for {
		if _, err := t.adm(ctx, "--op", "show", "--mode", "system"); err == nil {
			return t, nil
		}
		select {
		case <-t.exited:
			return nil, fmt.Errorf("testenv: tgtd exited at start: %s", t.log.String())
		case <-ctx.Done():
			t.kill()
			return nil, fmt.Errorf("testenv: tgtd did not answer: %w", ctx.Err())
		case <-time.After(20 * time.Millisecond):
		}
	}
}

func (t *TGT) adm(ctx context.Context, args ...string) ([]byte, error) {
	ctx, cancel := context.WithTimeout(ctx, 10*time.Second)
	defer cancel()
	out, err := exec.CommandContext(ctx, "tgtadm", append([]string{"-C", t.ctl, "--lld", "iscsi"}, args...)...).CombinedOutput()
	if err != nil {
		return out, fmt.Errorf("tgtadm %v: %w: %s", args, err, bytes.TrimSpace(out))
	}
	return out, nil
}

// AddTarget creates target tid named iqn with LUN 1 backed by file (which
// must exist), open to 127.0.0.1. A non-empty chapUser requires CHAP login
// with chapPassword (an account is created on first use; later targets
// bind the same user and its first password).
func (t *TGT) AddTarget(ctx context.Context, tid int, iqn, file, chapUser, chapPassword string) error {
	return t.AddTargetWith(ctx, tid, iqn, file, TargetOptions{CHAPUser: chapUser, CHAPPassword: chapPassword})
}

// TargetOptions are a target's optional settings.
type TargetOptions struct {
	CHAPUser, CHAPPassword string
	// Initiators, when set, is the target's initiator-name ACL: only these
	// names may log in (instead of any initiator on 127.0.0.1).
	Initiators []string
	// VendorID and ProductID are what LUN 1 answers to SCSI INQUIRY (at
	// most 8 and 16 bytes); tgt's own ("IET", "VIRTUAL-DISK") when empty.
	VendorID, ProductID string
}

// AddTargetWith is AddTarget with o's settings.
func (t *TGT) AddTargetWith(ctx context.Context, tid int, iqn, file string, o TargetOptions) error {
	id := strconv.Itoa(tid)
	steps := [][]string{
		{"--op", "new", "--mode", "target", "--tid", id, "-T", iqn},
		{"--op", "new", "--mode", "logicalunit", "--tid", id, "--lun", "1", "-b", file, "--bstype", "rdwr"},
	}
	if len(o.Initiators) == 0 {
		// tgt lets in an initiator that passes the address ACL or the name
		// ACL: a target bound to names must not be bound to the address.
		steps = append(steps, []string{"--op", "bind", "--mode", "target", "--tid", id, "-I", "127.0.0.1"})
	}
	if o.VendorID != "" || o.ProductID != "" {
		steps = append(steps, []string{"--op", "update", "--mode", "logicalunit", "--tid", id, "--lun", "1",
			"--params", fmt.Sprintf("vendor_id=%s,product_id=%s", o.VendorID, o.ProductID)})
	}
	for _, name := range o.Initiators {
		steps = append(steps, []string{"--op", "bind", "--mode", "target", "--tid", id, "-Q", name})
	}
	chapUser, chapPassword := o.CHAPUser, o.CHAPPassword
	if chapUser != "" {
		t.mu.Lock()
		if !t.accounts[chapUser] {
			if _, err := t.adm(ctx, "--op", "new", "--mode", "account", "--user", chapUser, "--password", chapPassword); err != nil {
				t.mu.Unlock()
				return fmt.Errorf("testenv: tgt account %s: %w", chapUser, err)
			}
			if t.accounts == nil {
				t.accounts = map[string]bool{}
			}
			t.accounts[chapUser] = true
		}
		t.mu.Unlock()
		steps = append(steps, []string{"--op", "bind", "--mode", "account", "--tid", id, "--user", chapUser})
	}
	for i, s := range steps {
		if _, err := t.adm(ctx, s...); err != nil {
			return fmt.Errorf("testenv: tgt target %s: %w", iqn, err)
		}
		if i == 0 {
			t.mu.Lock()
			t.tids = append(t.tids, tid)
			t.mu.Unlock()
		}
	}
	return nil
}

// Stop deletes the targets (tgtd ignores SIGTERM while it has any) and ends
// tgtd; it kills it by pid if it does not go.
func (t *TGT) Stop() error {
	if t == nil {
		return nil
	}
	ctx, cancel := context.WithTimeout(context.Background(), 15*time.Second)
	defer cancel()
	var errs []error
	t.mu.Lock()
	for _, tid := range t.tids {
		if _, err := t.adm(ctx, "--op", "delete", "--mode", "target", "--tid", strconv.Itoa(tid), "--force"); err != nil {
			errs = append(errs, err)
		}
	}
	t.tids = nil
	t.mu.Unlock()
	_, _ = t.adm(ctx, "--op", "delete", "--mode", "system")
	select {
	case <-t.exited:
	case <-time.After(5 * time.Second):
		errs = append(errs, errors.New("testenv: tgtd did not exit; killed"))
		t.kill()
	}
	return errors.Join(errs...)
}

func (t *TGT) kill() {
	select {
	case <-t.exited:
	default:
		t.cmd.Process.Kill()
		<-t.exited
	}
}

// freePort returns a TCP port on 127.0.0.1 that was free a moment ago.
func freePort() (int, error) {
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		return 0, err
	}
	defer l.Close()
	return l.Addr().(*net.TCPAddr).Port, nil
}

// MakeFile creates a sparse file of size bytes (a LUN or image backing).
func MakeFile(path string, size int64) error {
	if err := os.MkdirAll(filepath.Dir(path), 0o755); err != nil {
		return err
	}
	f, err := os.OpenFile(path, os.O_CREATE|os.O_RDWR|os.O_EXCL, 0o600)
	if err != nil {
		return err
	}
	if err := f.Truncate(size); err != nil {
		f.Close()
		return err
	}
	return f.Close()
}
