package confine

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"slices"
	"sort"
	"strings"
	"syscall"

	"github.com/vmsup/vmsup/internal/host/posixacl"
	"github.com/vmsup/vmsup/internal/util/atomicfile"
	"github.com/vmsup/vmsup/internal/vm/vmerr"
	"github.com/vmsup/vmsup/internal/vm/vmstore"
	"github.com/vmsup/vmsup/units"
)

// The confinement record (Root/security/NAME.json), hotplug changes to it,
// and taking grants back, handing shared ones over to VMs still using them.

// Extend extends a running VM's confinement by files it is about to
// use (a hot-plugged disk and its backing chain): the QEMU user gets access
// and the AppArmor profile, if loaded, is reloaded with them, before the
// device is added. The unit's mount namespace is fixed at start, so a
// hot-plugged file must lie under a path the unit already sees (an image
// directory, not /tmp or /home).
func (m *Manager) Extend(ctx context.Context, name string, rules ...units.PathRule) error {
	return m.changeConfinement(ctx, name, func(c *Record) error {
		unlock, err := m.lock(ctx)
		if err != nil {
			return err
		}
		defer unlock()
		var ns []need
		defer func() { closeNeeds(ns) }()
		for _, r := range rules {
			if c.Profile != nil {
				if err := c.Profile.AddPath(r); err != nil {
					return err
				}
			}
			// A disk's file in a place: granted through the object checked.
			f, place, err := m.openRule(r.Path)
			if err != nil {
				return err
			}
			ns = append(ns, need{path: r.Path, mode: r.Mode, file: f, place: place})
		}
		return m.grantNeeds(name, c, ns)
	})
}

// Shrink undoes Extend after a device was detached.
func (m *Manager) Shrink(ctx context.Context, name string, paths ...string) error {
	return m.changeConfinement(ctx, name, func(c *Record) error {
		for _, p := range paths {
			if c.Profile != nil {
				c.Profile.RemovePath(p)
			}
		}
		unlock, err := m.lock(ctx)
		if err != nil {
			return err
		}
		defer unlock()
		var keep []aclGrant
		for _, g := range c.Grants {
			if !slices.Contains(paths, g.Path) {
				keep = append(keep, g)
				continue
			}
			if err := m.releaseGrant(c, g); err != nil {
				return err
			}
		}
		c.Grants = keep
		var uses []string
		for _, u := range c.Uses {
			if !slices.Contains(paths, u) {
				uses = append(uses, u)
			}
		}
		c.Uses = uses
		return nil
	})
}

func (m *Manager) changeConfinement(ctx context.Context, name string, change func(*Record) error) error {
	c, err := m.Read(name)
	if err != nil {
		return fmt.Errorf("vm %q: confinement: %w", name, err)
	}
	if err := change(c); err != nil {
		return vmerr.Wrap(name, err)
	}
	if c.AppArmor.Profile != "" {
		if err := m.reloadProfile(ctx, name, c); err != nil {
			return vmerr.Wrap(name, err)
		}
	}
	return m.writeConfinement(name, c)
}

func (m *Manager) Read(name string) (*Record, error) {
	b, err := os.ReadFile(m.securityRecord(name))
	if err != nil {
		return nil, err
	}
	var c Record
	if err := json.Unmarshal(b, &c); err != nil {
		return nil, fmt.Errorf("%s: %w", m.securityRecord(name), err)
	}
	return &c, nil
}

func (m *Manager) writeConfinement(name string, c *Record) error {
	if err := os.MkdirAll(m.securityDir(), 0o700); err != nil {
		return err
	}
	b, err := json.MarshalIndent(c, "", "  ")
	if err != nil {
		return err
	}
	return atomicfile.WriteFile(m.securityRecord(name), b, 0o600)
}

// Teardown takes back what Confine gave once QEMU is gone; idempotent.
func (m *Manager) Teardown(ctx context.Context, name string) error {
	c, err := m.Read(name)
	if errors.Is(err, os.ErrNotExist) {
		return nil
	}
	if err != nil {
		return fmt.Errorf("confinement: %w", err)
	}
	var errs []error
	if c.AppArmor.File != "" && m.AppArmorUnusable == "" {
		if err := (units.Parser{}).Unload(ctx, c.AppArmor.File); err != nil {
			errs = append(errs, err)
		}
	}
	if err := m.releaseLocked(ctx, name, c); err != nil {
		errs = append(errs, err)
	}
	if c.AppArmor.File != "" {
		os.Remove(c.AppArmor.File)
	}
	if len(errs) == 0 {
		if err := os.Remove(m.securityRecord(name)); err != nil && !errors.Is(err, os.ErrNotExist) {
			errs = append(errs, err)
		}
	}
	return errors.Join(errs...)
}

func (m *Manager) releaseLocked(ctx context.Context, name string, c *Record) error {
	unlock, err := m.lock(ctx)
	if err != nil {
		return err
	}
	defer unlock()
	// This VM no longer uses anything: drop its record's uses first so the
	// hand-over below never picks it.
	os.Remove(m.securityRecord(name))
	return m.release(c)
}

// release takes back what c was given: chowned state files get their owner
// back, ACL entries are removed unless another VM's record still uses the
// path, in which case that VM's record inherits the grant.
func (m *Manager) release(c *Record) error {
	var errs []error
	for i := len(c.Chowned) - 1; i >= 0; i-- {
		ch := c.Chowned[i]
		if err := os.Lchown(ch.Path, ch.UID, ch.GID); err != nil && !errors.Is(err, os.ErrNotExist) {
			errs = append(errs, err)
		}
		if fi, err := os.Lstat(ch.Path); err == nil && fi.IsDir() { // the state directory: what QEMU created there goes back too
			ents, _ := os.ReadDir(ch.Path)
			for _, e := range ents {
				f := filepath.Join(ch.Path, e.Name())
				if fi, err := os.Lstat(f); err == nil && fi.Sys().(*syscall.Stat_t).Uid == c.UID {
					_ = os.Lchown(f, ch.UID, ch.GID)
				}
			}
		}
	}
	others := m.otherConfinements(c)
	for i := len(c.Grants) - 1; i >= 0; i-- {
		g := c.Grants[i]
		if heir := usedBy(others, g.Path, c.UID); heir != "" {
			if oc, err := m.Read(heir); err == nil {
				oc.Grants = append(oc.Grants, g)
				errs = append(errs, m.writeConfinement(heir, oc))
				continue
			}
		}
		if err := m.releaseGrant(c, g); err != nil {
			errs = append(errs, err)
		}
	}
	c.Chowned, c.Grants = nil, nil
	return errors.Join(errs...)
}

func (m *Manager) releaseGrant(c *Record, g aclGrant) error {
	if g.Object != nil {
		return revokeObject(c, g)
	}
	if err := posixacl.RevokeUser(g.Path, c.UID, g.Prev); err != nil {
		return fmt.Errorf("take back %s's access to %s: %w", c.User, g.Path, err)
	}
	return nil
}

// otherConfinements reads the records of the other VMs, by VM name.
func (m *Manager) otherConfinements(self *Record) map[string]*Record {
	out := map[string]*Record{}
	files, _ := filepath.Glob(filepath.Join(m.securityDir(), "*.json"))
	sort.Strings(files)
	for _, f := range files {
		name := strings.TrimSuffix(filepath.Base(f), ".json")
		if c, err := m.Read(name); err == nil && c != self {
			out[name] = c
		}
	}
	return out
}

func usedBy(cs map[string]*Record, path string, uid uint32) string {
	names := make([]string, 0, len(cs))
	for n := range cs {
		names = append(names, n)
	}
	sort.Strings(names)
	for _, n := range names {
		if cs[n].UID == uid && slices.Contains(cs[n].Uses, path) {
			return n
		}
	}
	return ""
}

// lock serializes grant bookkeeping across VMs and vmsup processes.
func (m *Manager) lock(ctx context.Context) (func(), error) {
	if err := os.MkdirAll(m.securityDir(), 0o700); err != nil {
		return nil, err
	}
	l, ok, err := vmstore.LockFile(ctx, filepath.Join(m.securityDir(), ".lock"), true)
	if err != nil || !ok {
		return nil, fmt.Errorf("security lock: %v", orErr(err, ctx.Err()))
	}
	return l.Unlock, nil
}

func orErr(a, b error) error {
	if a != nil {
		return a
	}
	return b
}
