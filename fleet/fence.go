package fleet

import (
	"context"
	"encoding/json"
	"fmt"
	"os/exec"
	"slices"
	"strings"
	"time"

	"github.com/vmsup/vmsup/spec"
)

// CephFencer fences a lost host from a VM's RBD disks before the VM starts
// elsewhere: every client still attached to an image (its watchers) and
// every holder of its lock is blocklisted on the OSDs, so a QEMU on the
// lost host that still runs can no longer write a byte, and the locks are
// removed, so the new QEMU takes the exclusive lock at once. It uses the
// disk's own ceph.conf and cephx user, which needs the "profile rbd" mon
// caps (they allow blocklisting). It calls the rbd and ceph tools.
type CephFencer struct {
	// History, when set, gets each lock owner the fencer found and
	// blocklisted: the fleet's record of who held each image.
	History func(vm, image, owner string)
}

// lockOwner is one holder of an image's lock.
type lockOwner struct {
	ID, Locker, Address string
}

// Fence implements Fencer.
func (c *CephFencer) Fence(ctx context.Context, lost string, vm *spec.VM) error {
	for _, d := range vm.Disks {
		if d.Type != spec.DiskRBD || d.ReadOnly {
			continue
		}
		image := d.Pool + "/" + d.Image
		common := cephArgs(d)
		addrs, err := watchers(ctx, common, image)
		if err != nil {
			return fmt.Errorf("disk %s (%s): %w", d.Name, image, err)
		}
		locks, err := locks(ctx, common, image)
		if err != nil {
			return fmt.Errorf("disk %s (%s): %w", d.Name, image, err)
		}
		for _, l := range locks {
			if !slices.Contains(addrs, l.Address) {
				addrs = append(addrs, l.Address)
			}
		}
		for _, a := range addrs {
			if _, err := run(ctx, "ceph", append(common, "osd", "blocklist", "add", a)...); err != nil {
				return fmt.Errorf("disk %s: blocklist %s: %w", d.Name, a, err)
			}
		}
		for _, l := range locks {
			if c.History != nil {
				c.History(vm.Name, image, l.Locker+" "+l.Address)
			}
			if _, err := run(ctx, "rbd", append(common, "lock", "rm", image, l.ID, l.Locker)...); err != nil {
				return fmt.Errorf("disk %s: remove the lock of %s: %w", d.Name, l.Locker, err)
			}
		}
	}
	return nil
}

// cephArgs are the disk's cluster and credentials for the tools.
func cephArgs(d spec.Disk) []string {
	var args []string
	if d.CephConf != "" {
		args = append(args, "--conf", d.CephConf)
	}
	if d.User != "" {
		args = append(args, "--id", d.User)
	}
	if d.SecretFile != "" {
		args = append(args, "--keyfile", d.SecretFile)
	}
	return args
}

// watchers are the addresses of the clients that have the image open.
func watchers(ctx context.Context, common []string, image string) ([]string, error) {
	out, err := run(ctx, "rbd", append(common, "status", "--format", "json", image)...)
	if err != nil {
		return nil, err
	}
	var st struct {
		Watchers []struct {
			Address string `json:"address"`
		} `json:"watchers"`
	}
	if err := json.Unmarshal(out, &st); err != nil {
		return nil, fmt.Errorf("rbd status: %w: %s", err, out)
	}
	var addrs []string
	for _, w := range st.Watchers {
		addrs = append(addrs, w.Address)
	}
	return addrs, nil
}

// locks lists the image's lock holders. rbd prints a list (Quincy and
// later) or a map by lock id (before); both are read.
func locks(ctx context.Context, common []string, image string) ([]lockOwner, error) {
	out, err := run(ctx, "rbd", append(common, "lock", "ls", "--format", "json", image)...)
	if err != nil {
		return nil, err
	}
	type entry struct {
		ID      string `json:"id"`
		Locker  string `json:"locker"`
		Address string `json:"address"`
	}
	var list []entry
	if err := json.Unmarshal(out, &list); err != nil {
		var byID map[string]entry
		if err2 := json.Unmarshal(out, &byID); err2 != nil {
			return nil, fmt.Errorf("rbd lock ls: %w: %s", err, out)
		}
		for id, e := range byID {
			e.ID = id
			list = append(list, e)
		}
	}
	var owners []lockOwner
	for _, e := range list {
		owners = append(owners, lockOwner(e))
	}
	return owners, nil
}

// run runs a Ceph tool, bounded: a cluster that does not answer must not
// hold the scheduler.
func run(ctx context.Context, name string, args ...string) ([]byte, error) {
	ctx, cancel := context.WithTimeout(ctx, 30*time.Second)
	defer cancel()
	cmd := exec.CommandContext(ctx, name, args...)
	var stderr strings.Builder
	cmd.Stderr = &stderr
	out, err := cmd.Output()
	if err != nil {
		return out, fmt.Errorf("%s %s: %v: %s", name, strings.Join(args, " "), err, strings.TrimSpace(stderr.String()))
	}
	return out, nil
}
