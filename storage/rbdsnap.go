package storage

import (
	"context"
	"errors"
	"fmt"
	"os/exec"
	"strings"
	"time"

	"github.com/vmsup/vmsup/spec"
)

// RBDSnap runs `rbd snap VERB` ("create", "rm" or "rollback") for
// snapshot snap of RBD disk d's image, as the disk's own Ceph user (its
// ceph_conf, monitors and key file). On a running VM's image librbd hands
// a create to the client holding the image's lock (QEMU), which flushes
// first.
func (t Tools) RBDSnap(ctx context.Context, d spec.Disk, verb, snap string) error {
	if d.Type != spec.DiskRBD {
		return fmt.Errorf("disk %q is not an rbd disk", d.Name)
	}
	var args []string
	if d.CephConf != "" {
		args = append(args, "-c", d.CephConf)
	}
	if len(d.Monitors) > 0 {
		args = append(args, "-m", strings.Join(d.Monitors, ","))
	}
	if d.User != "" {
		args = append(args, "--id", d.User)
	}
	if d.SecretFile != "" {
		args = append(args, "--keyfile", d.SecretFile)
	}
	image := d.Pool + "/"
	if d.Namespace != "" {
		image += d.Namespace + "/"
	}
	args = append(args, "--no-progress", "snap", verb, image+d.Image+"@"+snap)
	ctx, cancel := context.WithTimeout(ctx, t.timeout(true)+40*time.Second) // a rollback copies data
	defer cancel()
	out, err := exec.CommandContext(ctx, "rbd", args...).CombinedOutput()
	if err != nil {
		msg := oneLine(string(out))
		if msg == "" {
			msg = err.Error()
		}
		if verb == "rm" && strings.Contains(msg, "No such file") {
			return nil // gone already: removing again is done
		}
		return errors.New("rbd snap " + verb + " " + image + d.Image + "@" + snap + ": " + msg)
	}
	return nil
}
