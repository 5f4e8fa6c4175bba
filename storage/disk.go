package storage

import (
	"cmp"
	"context"
	"errors"
	"fmt"
	"net"
	"os"
	"path/filepath"
	"strings"
	"time"

	"github.com/vmsup/vmsup/internal/host/userfile"
	"github.com/vmsup/vmsup/spec"
)

// SeedPath is where Prepare builds the seed ISO of disk in a VM's state dir.
func SeedPath(stateDir, disk string) string {
	return filepath.Join(stateDir, "seed-"+disk+".iso")
}

// SecretPath is where Prepare keeps the secret of disk in a VM's state dir
// (a 0600 file in the 0700 directory "secrets").
func SecretPath(stateDir, disk string) string {
	return filepath.Join(stateDir, "secrets", disk)
}

// HostFiles returns the files Prepare makes for d in stateDir ("" where d
// needs none), so an argv can be rendered without preparing anything.
func HostFiles(stateDir string, d spec.Disk) (image, secret string) {
	if d.Type == spec.DiskSeed {
		image = SeedPath(stateDir, d.Name)
	}
	if d.NeedsSecret() {
		secret = SecretPath(stateDir, d.Name)
	}
	return image, secret
}

// Check verifies that QEMU will be able to open d, changing nothing: images
// and their backing chains exist, a new image can be created as asked, no
// other process holds a writable image, block devices are block devices, and
// iSCSI and RBD disks answer with the given credentials. The error is an
// *Error naming the disk.
func (t Tools) Check(ctx context.Context, d spec.Disk) error {
	fail := func(err error, format string, args ...any) error {
		return diskErr(d.Name, "file", err, format, args...)
	}
	if d.SecretFile != "" { // first: it is read (bounded) before anything is asked of the network
		if _, err := readSecret(d.SecretFile); err != nil {
			return diskErr(d.Name, "secret_file", err, "%v", err)
		}
	}
	switch d.Type {
	case spec.DiskFile:
		st, err := os.Stat(d.File)
		switch {
		case errors.Is(err, os.ErrNotExist):
			return t.checkNew(ctx, d)
		case err != nil:
			return fail(err, "%v", err)
		case !st.Mode().IsRegular():
			// A FIFO would block every open (and hold the VM's lock).
			return fail(nil, "%s is %s, not an image file (use type \"block\" for a block device)", d.File, userfile.Kind(st.Mode()))
		}
		if err := checkWriteLock(d); err != nil {
			return err
		}
		if _, err := t.Chain(ctx, d.File, d.Format); err != nil {
			return fail(err, "%v", err)
		}
	case spec.DiskBlock:
		st, err := os.Stat(d.File)
		if err != nil {
			return fail(err, "%v", err)
		}
		if st.Mode()&os.ModeDevice == 0 || st.Mode()&os.ModeCharDevice != 0 {
			return fail(nil, "%s is not a block device (use type \"file\" for image files)", d.File)
		}
		if err := checkWriteLock(d); err != nil {
			return err
		}
		if _, err := t.Info(ctx, d.File, d.Format); err != nil {
			return fail(err, "%v", err)
		}
	case spec.DiskISO:
		st, err := os.Stat(d.File)
		if err != nil {
			return fail(err, "%v", err)
		}
		if !st.Mode().IsRegular() && (st.Mode()&os.ModeDevice == 0 || st.Mode()&os.ModeCharDevice != 0) {
			return fail(nil, "%s is %s, not an ISO image or a block device", d.File, userfile.Kind(st.Mode()))
		}
	case spec.DiskSeed:
		if _, err := seedFiles(d); err != nil {
			return diskErr(d.Name, "", err, "%v", err)
		}
	case spec.DiskISCSI:
		return t.probeISCSI(ctx, d)
	case spec.DiskRBD:
		return t.probeRBD(ctx, d)
	default:
		return diskErr(d.Name, "type", nil, "unknown disk type %q", d.Type)
	}
	return nil
}

// checkWriteLock fails a writable disk whose image another process holds
// (QEMU's image locking), before QEMU would fail on it.
func checkWriteLock(d spec.Disk) error {
	if d.ReadOnly {
		return nil
	}
	locked, err := WriteLocked(d.File)
	if err != nil {
		return diskErr(d.Name, "file", err, "%v", err)
	}
	if locked {
		return diskErr(d.Name, "file", ErrInUse, "%s: %v (QEMU image lock: another VM or qemu-img has it open for writing)", d.File, ErrInUse)
	}
	return nil
}

// checkNew checks a file disk whose image does not exist yet: Prepare will
// create it, empty with size or as an overlay on backing.
func (t Tools) checkNew(ctx context.Context, d spec.Disk) error {
	fail := func(err error, format string, args ...any) error {
		return diskErr(d.Name, "file", err, format, args...)
	}
	failAt := func(field string, err error, format string, args ...any) error {
		return diskErr(d.Name, field, err, format, args...)
	}
	if d.ReadOnly {
		return fail(nil, "%s: no such file (a read-only disk is not created)", d.File)
	}
	if d.Image != "" {
		return nil // made on its stored image at start (internal/imagestore checks it)
	}
	if d.Size == 0 && d.Backing == "" {
		return fail(nil, "%s: no such file (give size, or backing, to have vmsup create it)", d.File)
	}
	if st, err := os.Stat(filepath.Dir(d.File)); err != nil || !st.IsDir() {
		return fail(err, "%s: directory %s does not exist", d.File, filepath.Dir(d.File))
	}
	if d.Backing == "" {
		return nil
	}
	if _, err := os.Stat(d.Backing); err != nil {
		if errors.Is(err, os.ErrNotExist) {
			return failAt("backing", err, "base image %s: no such file", d.Backing)
		}
		return failAt("backing", err, "base image %v", err)
	}
	chain, err := t.Chain(ctx, d.Backing, "")
	if err != nil {
		return failAt("backing", err, "base image: %v", err)
	}
	if base := chain[0].VirtualSize; d.Size != 0 && int64(d.Size) < base {
		return failAt("size", nil, "size %s is smaller than its base image %s (%s): an overlay cannot shrink its base",
			d.Size, d.Backing, spec.Size(base))
	}
	return nil
}

// Prepared is what Prepare made for one disk.
type Prepared struct {
	Image      string // the seed ISO Prepare built ("" for other types)
	SecretFile string // the disk's secret in the state dir ("" if none)
	NewImage   string // the disk's file, when Prepare created it
	created    []string
}

// Undo removes what Prepare created: a new image, a seed, a secret file.
// Existing images are never touched.
func (p Prepared) Undo() {
	for _, f := range p.created {
		os.Remove(f)
	}
}

// Prepare makes the host ready for d after Check passed: it creates a
// missing image (qcow2 or raw of size, or an overlay on backing), builds a
// seed ISO and copies the disk's secret into stateDir (0600). The base of an
// overlay is only read.
func (t Tools) Prepare(ctx context.Context, d spec.Disk, stateDir string) (Prepared, error) {
	var p Prepared
	fail := func(err error, format string, args ...any) (Prepared, error) {
		p.Undo()
		return Prepared{}, diskErr(d.Name, "", err, format, args...)
	}
	switch d.Type {
	case spec.DiskFile:
		if _, err := os.Stat(d.File); errors.Is(err, os.ErrNotExist) {
			baseFormat := ""
			if d.Backing != "" {
				info, err := t.Info(ctx, d.Backing, "")
				if err != nil {
					return fail(err, "base image: %v", err)
				}
				baseFormat = info.Format
			}
			if err := t.Create(ctx, d.File, d.Format, int64(d.Size), d.Backing, baseFormat); err != nil {
				return fail(err, "create %s: %v", d.File, err)
			}
			p.created = append(p.created, d.File)
			p.NewImage = d.File
		}
	case spec.DiskSeed:
		files, err := seedFiles(d)
		if err != nil {
			return fail(err, "%v", err)
		}
		p.Image = SeedPath(stateDir, d.Name)
		if err := BuildSeed(p.Image, files); err != nil {
			return fail(err, "%v", err)
		}
		p.created = append(p.created, p.Image)
	}
	if d.NeedsSecret() {
		data, err := readSecret(d.SecretFile)
		if err != nil {
			return fail(err, "secret_file: %v", err)
		}
		p.SecretFile = SecretPath(stateDir, d.Name)
		if err := writeSecret(p.SecretFile, data); err != nil {
			return fail(err, "secret: %v", err)
		}
		p.created = append(p.created, p.SecretFile)
	}
	return p, nil
}

// Teardown removes the secrets Prepare copied into stateDir; QEMU has read
// them when it created its secret objects. Idempotent.
func Teardown(stateDir string) error {
	return os.RemoveAll(filepath.Join(stateDir, "secrets"))
}

// RemoveSecret removes one disk's secret file (after a detach).
func RemoveSecret(stateDir, disk string) error {
	err := os.Remove(SecretPath(stateDir, disk))
	if errors.Is(err, os.ErrNotExist) {
		return nil
	}
	return err
}

// seedFiles collects a seed's NoCloud files from the spec (inline or files).
func seedFiles(d spec.Disk) (map[string][]byte, error) {
	out := map[string][]byte{}
	for _, f := range []struct{ name, inline, path string }{
		{"user-data", d.UserData, d.UserDataFile},
		{"meta-data", d.MetaData, d.MetaDataFile},
		{"network-config", d.NetworkConfig, d.NetworkConfigFile},
	} {
		switch {
		case f.path != "":
			b, err := userfile.Read(f.path, userfile.MaxSeedFile)
			if err != nil {
				return nil, fmt.Errorf("%s: %w", strings.ReplaceAll(f.name, "-", "_")+"_file", err)
			}
			out[f.name] = b
		case f.inline != "":
			out[f.name] = []byte(f.inline)
		}
	}
	if _, ok := out["user-data"]; !ok {
		out["user-data"] = []byte("#cloud-config\n{}\n") // NoCloud wants the file even when empty
	}
	return out, nil
}

// portalTimeout bounds the TCP check of an iSCSI portal.
const portalTimeout = 3 * time.Second

func (t Tools) probeISCSI(ctx context.Context, d spec.Disk) error {
	var dl net.Dialer
	cctx, cancel := context.WithTimeout(ctx, portalTimeout)
	c, err := dl.DialContext(cctx, "tcp", d.Portal)
	cancel()
	if err != nil {
		return diskErr(d.Name, "portal", err, "iSCSI portal %s unreachable: %v", d.Portal, unwrapOp(err))
	}
	c.Close()
	opts := []string{"driver=raw", "file.driver=iscsi", "file.transport=" + cmp.Or(d.Transport, "tcp"), "file.portal=" + esc(d.Portal),
		"file.target=" + esc(d.Target), fmt.Sprintf("file.lun=%d", d.LUN)}
	if d.InitiatorName != "" { // the caller fills in the VM's default (spec.Disk.InitiatorFor)
		opts = append(opts, "file.initiator-name="+esc(d.InitiatorName))
	}
	if d.HeaderDigest != "" {
		opts = append(opts, "file.header-digest="+d.HeaderDigest)
	}
	if d.User != "" {
		opts = append(opts, "file.user="+esc(d.User), "file.password-secret=sec0")
	}
	if err := t.probe(ctx, d, opts); err != nil {
		return diskErr(d.Name, "", err, "iSCSI %s LUN %d at %s: %v", d.Target, d.LUN, d.Portal, err)
	}
	return nil
}

func (t Tools) probeRBD(ctx context.Context, d spec.Disk) error {
	opts := []string{"driver=raw", "file.driver=rbd", "file.pool=" + esc(d.Pool), "file.image=" + esc(d.Image)}
	for _, kv := range [][2]string{{"snapshot", d.Snapshot}, {"namespace", d.Namespace}} {
		if kv[1] != "" {
			opts = append(opts, "file."+kv[0]+"="+esc(kv[1]))
		}
	}
	for i, a := range d.AuthClientRequired {
		opts = append(opts, fmt.Sprintf("file.auth-client-required.%d=%s", i, a))
	}
	if d.CephConf != "" {
		if _, err := os.Stat(d.CephConf); err != nil {
			return diskErr(d.Name, "ceph_conf", err, "%v", err)
		}
		opts = append(opts, "file.conf="+esc(d.CephConf))
	}
	for i, m := range d.Monitors {
		host, port, _ := net.SplitHostPort(m)
		opts = append(opts, fmt.Sprintf("file.server.%d.host=%s", i, esc(host)), fmt.Sprintf("file.server.%d.port=%s", i, esc(port)))
	}
	if d.User != "" {
		opts = append(opts, "file.user="+esc(d.User))
	}
	if d.SecretFile != "" {
		opts = append(opts, "file.key-secret=sec0")
	}
	if err := t.probe(ctx, d, opts); err != nil {
		return diskErr(d.Name, "", err, "rbd pool %q image %q: %v", d.Pool, d.Image, err)
	}
	return nil
}

// probe opens the disk with qemu-img info through QEMU's own driver and
// options; the secret goes in a temporary 0600 file, never on the command
// line.
func (t Tools) probe(ctx context.Context, d spec.Disk, opts []string) error {
	args := []string{"info", "--output=json"}
	if d.NeedsSecret() {
		data, err := readSecret(d.SecretFile)
		if err != nil {
			return fmt.Errorf("secret_file: %w", err)
		}
		path, remove, err := tempSecret(data)
		if err != nil {
			return err
		}
		defer remove()
		format := "raw" // as qemuargs declares it: base64 for a cephx key
		if d.Type == spec.DiskRBD {
			format = "base64"
		}
		args = append(args, "--object", "secret,id=sec0,format="+format+",file="+esc(path))
	}
	args = append(args, "--image-opts", strings.Join(opts, ","))
	_, err := t.run(ctx, true, args...)
	return err
}

// esc doubles commas for QEMU's key=value option syntax.
func esc(s string) string { return strings.ReplaceAll(s, ",", ",,") }

// unwrapOp drops net.OpError's "dial tcp ADDR:" prefix (the message names
// the portal already).
func unwrapOp(err error) error {
	var op *net.OpError
	if errors.As(err, &op) && op.Err != nil {
		return op.Err
	}
	return err
}
