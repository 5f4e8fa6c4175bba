package livemigrate

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"net"
	"os"
	"path/filepath"
	"strings"

	"github.com/vmsup/vmsup/internal/imagestore"
	"github.com/vmsup/vmsup/internal/lifecycle/operation"
	"github.com/vmsup/vmsup/internal/ops/migwire"
	"github.com/vmsup/vmsup/qemuargs"
	"github.com/vmsup/vmsup/qmp"
	"github.com/vmsup/vmsup/storage"
)

// Storage migration, the destination's side (the design: storage_out.go):
// each disk the source offers that this host does not see (its marker is
// not visible here) is made here empty, the same format and virtual size:
// an overlay on the same stored image (by digest) or backing file, whose
// top layer alone is copied (sync top, like libvirt's copy-storage-inc),
// else a whole image (sync full). QEMU exports them writable over its NBD
// server on a unix socket in its incoming directory, which vmsup relays
// from a TCP port (TLS, the stream's token). They are the journal's before
// they are made, and go with the rest of the destination unless the
// guest runs here.

// KindInStorage is the journal of a destination on another host that
// takes a copy of disks (its recovery also removes them if it tears the
// destination down). A vmsup that does not know it refuses to begin it,
// and one that finds it unknown cannot settle it: it never drops the
// copies' names.
const KindInStorage operation.Kind = "migrate-receive-storage"

// planCopies decides which of the source's disks this host takes a copy
// of, and how (Sync, its backing here).
func (d *incomingVM) planCopies(ctx context.Context, m migwire.Msg) ([]migwire.DiskCopy, error) {
	var out []migwire.DiskCopy
	for _, c := range m.Disks {
		mk, marked := m.Markers[c.File]
		if marked && exists(mk) || !marked && exists(c.File) {
			continue // shared storage (or unmarkable and here): no copy
		}
		if exists(c.File) {
			return nil, fmt.Errorf("disk %q: %s exists on this host but is not the source's (its marker is not visible here): "+
				"move it away to take a copy of the source's, or put the disk on storage both hosts see", c.Name, c.File)
		}
		if c.Format != "qcow2" && c.Format != "raw" {
			return nil, fmt.Errorf("disk %q: format %q cannot be copied (qcow2 or raw)", c.Name, c.Format)
		}
		c.Sync, c.Export = "full", c.Name
		switch {
		case c.Image != "":
			im, err := d.mg.haveImage(ctx, c)
			if err != nil {
				return nil, fmt.Errorf("disk %q: %w", c.Name, err)
			}
			c.Sync, c.Backing, c.BackingFormat = "top", im.Path, im.Format
		case c.Backing != "":
			info, err := storage.Tools{}.Info(ctx, c.Backing, "")
			if err != nil {
				return nil, fmt.Errorf("disk %q: its backing file must be on this host at the same path: %w", c.Name, err)
			}
			c.Sync, c.BackingFormat = "top", info.Format
		}
		out = append(out, c)
	}
	return out, nil
}

// haveImage is the stored image c's overlay is on, pulled by digest from
// where the source's store got it when this store lacks it (as a fleet
// agent does before an up: fleet/images.go); without a recorded source
// the error says to pull it here first.
func (mg *Migrator) haveImage(ctx context.Context, c migwire.DiskCopy) (imagestore.Image, error) {
	st := mg.env.Images().Store
	im, err := st.Resolve(c.Image)
	if !errors.Is(err, imagestore.ErrNotFound) {
		return im, err
	}
	if c.ImageSource == "" {
		return im, fmt.Errorf("its image %s is not in this host's store, and the source's store recorded no source to pull it from: vmsup image pull it here first", c.Image)
	}
	p := imagestore.Pull{Source: c.ImageSource}
	if imagestore.IsHTTP(c.ImageSource) {
		// The digest is the stored file's sha256; a download checked
		// another way (a compressed file's sum) is checked that way.
		p.SHA256 = strings.TrimPrefix(c.Image, "sha256:")
		if alg, sum, ok := strings.Cut(c.ImageVerified, ":"); ok && alg == "sha512" {
			p.SHA256, p.SHA512 = "", sum
		} else if ok && alg == "sha256" {
			p.SHA256 = sum
		}
	}
	mg.log.Info("pulling image for a disk copy", "image", c.Image, "source", c.ImageSource)
	got, err := st.Pull(ctx, p)
	switch {
	case err != nil:
		return im, fmt.Errorf("its image %s is not in this host's store, and pulling it from %s failed: %w (vmsup image pull it here first)", c.Image, c.ImageSource, err)
	case got.Digest != c.Image:
		return im, fmt.Errorf("its image %s is not in this host's store, and %s gave image %s instead", c.Image, c.ImageSource, got.Digest)
	}
	return got, nil
}

// copyArgs fills a's copies: the shared-storage check skips them and the
// disk-copies step makes them; the journal is the storage kind.
func (d *incomingVM) copyArgs(a *StartArgs) {
	if len(d.copies) == 0 {
		return
	}
	a.Journal = KindInStorage
	a.Copies = map[string]bool{}
	for _, c := range d.copies {
		a.Copies[c.File] = true
	}
	var made []string
	a.MakeCopies = func(ctx context.Context) error {
		for _, c := range d.copies {
			if err := (storage.Tools{}).Create(ctx, c.File, c.Format, c.Size, c.Backing, c.BackingFormat); err != nil {
				return fmt.Errorf("disk %q: make the copy's image: %w", c.Name, err)
			}
			made = append(made, c.File)
		}
		return nil
	}
	a.UndoCopies = func(context.Context) {
		for _, f := range made {
			os.Remove(f)
		}
		made = nil
	}
}

// copyFiles are the files of the copies (the journal's).
func (d *incomingVM) copyFiles() []string {
	var out []string
	for _, c := range d.copies {
		out = append(out, c.File)
	}
	return out
}

// exportCopies exports the copies' nodes over the new QEMU's NBD server
// (a unix socket in its incoming directory) and relays a TCP port on the
// stream's address to it, with the stream's certificate and token.
func (d *incomingVM) exportCopies(ctx context.Context, listen string, tlsLn func(net.Listener) net.Listener) error {
	if len(d.copies) == 0 {
		return nil
	}
	sock := filepath.Join(d.st.Sockets().Dir, "nbd.sock")
	if err := d.mon.NBDServerStart(ctx, sock); err != nil {
		return fmt.Errorf("disk copies: nbd-server-start: %w", err)
	}
	d.nbdOn = true
	for _, c := range d.copies {
		e := qmp.BlockExport{ID: "migx-" + c.Name, NodeName: qemuargs.DiskNodeName(c.Name), Name: c.Export, Writable: true}
		if err := d.mon.BlockExportAdd(ctx, e); err != nil {
			return fmt.Errorf("disk %q: export it for the copy: %w", c.Name, err)
		}
	}
	var err error
	d.nbdRelay, d.nbdURI, err = relayNBD(listen, sock, d.token, tlsLn, d.mg.log)
	return err
}

// relayNBD relays a TCP port on listen (TLS by tlsLn, each connection's
// token checked) to the NBD server at sock; uri is "tcp:HOST:PORT".
func relayNBD(listen, sock, token string, tlsLn func(net.Listener) net.Listener, log *slog.Logger) (*migwire.Relay, string, error) {
	ln, err := net.Listen("tcp", net.JoinHostPort(listen, "0"))
	if err != nil {
		return nil, "", fmt.Errorf("disk copies: listen: %w", err)
	}
	relay := migwire.StartRelay(tlsLn(ln), func() (net.Conn, error) { return qmp.DialSocket(context.Background(), sock) },
		migwire.CheckToken(token), nil, log)
	_, port, _ := net.SplitHostPort(ln.Addr().String())
	return relay, "tcp:" + net.JoinHostPort(listen, port), nil
}

// stopExports ends the NBD server before the guest runs here: the source
// ended its copies at the switch-over, and the devices take their images'
// write permission back only once no export holds them.
func (d *incomingVM) stopExports(ctx context.Context) error {
	if d.nbdRelay != nil {
		d.nbdRelay.Close()
	}
	if !d.nbdOn {
		return nil
	}
	if err := d.mon.NBDServerStop(ctx); err != nil {
		return fmt.Errorf("disk copies: nbd-server-stop: %w", err)
	}
	d.nbdOn = false
	return nil
}

// recoverMigrateInStorage settles a destination that took copies: as any
// destination, and the copies go with it if it is torn down.
func (mg *Migrator) recoverMigrateInStorage(ctx context.Context, name string, op *operation.Op) (string, error) {
	in, err := operation.IntentOf[incomingIntent](op)
	if err != nil {
		return "", err
	}
	a, err := mg.settleIn(ctx, name, in)
	if err != nil {
		return "", err
	}
	if a == inTearDown {
		var errs []error
		for _, f := range in.Copies {
			if err := os.Remove(f); err != nil && !errors.Is(err, os.ErrNotExist) {
				errs = append(errs, err)
			}
		}
		if err := errors.Join(errs...); err != nil {
			return "", fmt.Errorf("remove the disk copies: %w", err)
		}
		return a.note() + "; its disk copies are removed", nil
	}
	return a.note(), nil
}

// recoverMigrateOutStorage settles a source that copied disks: as any
// source; then a guest running elsewhere takes its copied disks' images
// here with it (unless kept), and one running here loses what is left of
// its copy jobs.
func (mg *Migrator) recoverMigrateOutStorage(ctx context.Context, name string, op *operation.Op) (string, error) {
	in, err := operation.IntentOf[migrateIntent](op)
	if err != nil {
		return "", err
	}
	if in.NBDSock != "" {
		os.Remove(in.NBDSock)
	}
	note, err := mg.recoverMigrateOut(ctx, name, op)
	if err != nil {
		return "", err
	}
	if !exists(mg.paths(name).Dir) { // dropped: the guest runs on the destination
		if n := mg.removeSourceCopies(name, in.Copies, in.KeepDisks); n != "" {
			note += "; " + n
		}
		return note, nil
	}
	var copies []migwire.DiskCopy
	for _, n := range in.CopyNames {
		copies = append(copies, migwire.DiskCopy{Name: n})
	}
	if len(copies) > 0 {
		if c, release, err := mg.env.QMPSession(ctx, name); err == nil {
			dropMirrors(ctx, c, copies)
			release()
		}
	}
	return note, nil
}
