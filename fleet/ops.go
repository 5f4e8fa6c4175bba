package fleet

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"time"

	clientv3 "go.etcd.io/etcd/client/v3"

	"github.com/vmsup/vmsup/spec"
)

// ApplyResult is what Apply did to one VM.
type ApplyResult struct {
	Name       string `json:"name"`
	Action     string `json:"action"` // created, updated, unchanged
	Generation int64  `json:"generation"`
}

// ErrConflict is returned when the fleet changed under a command (another
// apply, the scheduler): nothing was written; run it again.
var ErrConflict = errors.New("the fleet changed during the command; nothing was written, run it again")

// applyBatch is how many VMs one transaction stores: etcd refuses a
// transaction of more than 128 operations by default (--max-txn-ops), and
// a new VM takes two (its spec, its pending status).
const applyBatch = 64

// Apply stores the VMs' specs, all or none, in one transaction (up to
// applyBatch VMs; a larger apply is several, each all or none, and a
// conflict says how many were stored: apply is idempotent, run it again): a
// VM whose TOML changed gets the next generation, which its owner applies.
// The files were parsed and validated by the caller; a name twice is
// refused before anything is written.
func (s *Store) Apply(ctx context.Context, files ...*spec.File) ([]ApplyResult, error) {
	return s.ApplyImages(ctx, nil, files...)
}

// ApplyImages is Apply recording each VM's images as images (the applying
// host's store: ResolveImages) resolves them; nil records none.
func (s *Store) ApplyImages(ctx context.Context, images func(*spec.File) ([]ImageRef, error), files ...*spec.File) ([]ApplyResult, error) {
	refs := make([][]ImageRef, len(files))
	for i, f := range files {
		if images == nil {
			break
		}
		var err error
		if refs[i], err = images(f); err != nil {
			return nil, err // nothing stored: one bad file stops them all
		}
	}
	seen := map[string]string{}
	for _, f := range files {
		if prev, dup := seen[f.VM.Name]; dup {
			return nil, f.Errorf("name", "VM %q is also defined in %s", f.VM.Name, prev)
		}
		seen[f.VM.Name] = f.Path
	}
	var out []ApplyResult
	for i := 0; i < len(files); i += applyBatch {
		end := min(i+applyBatch, len(files))
		res, err := s.applyBatch(ctx, files[i:end], refs[i:end])
		if err != nil {
			if i > 0 {
				return nil, fmt.Errorf("%w (the first %d of %d VMs were stored)", err, i, len(files))
			}
			return nil, err
		}
		out = append(out, res...)
	}
	return out, nil
}

func (s *Store) applyBatch(ctx context.Context, files []*spec.File, refs [][]ImageRef) ([]ApplyResult, error) {
	snap, err := s.Load(ctx, false)
	if err != nil {
		return nil, err
	}
	revs := map[string]int64{}
	var ops []clientv3.Op
	var out []ApplyResult
	for i, f := range files {
		name := f.VM.Name
		cur, exists := snap.VMs[name]
		r := ApplyResult{Name: name, Action: "unchanged", Generation: cur.Value.Generation}
		k := s.key("vms", name)
		revs[k] = cur.Rev
		if !exists || cur.Value.TOML != string(f.Raw) || cur.Value.File != f.Path || !slices.Equal(cur.Value.Images, refs[i]) {
			r.Generation++
			r.Action = map[bool]string{true: "updated", false: "created"}[exists]
			ops = append(ops, clientv3.OpPut(k, mustJSON(VMRecord{Name: name, File: f.Path, TOML: string(f.Raw), Generation: r.Generation, Images: refs[i]})))
			if !exists {
				ops = append(ops, clientv3.OpPut(s.key("status", name), mustJSON(Status{State: StatePending, Updated: time.Now().UTC()})))
			}
		}
		out = append(out, r)
	}
	if len(ops) == 0 {
		return out, nil
	}
	ok, err := s.cas(ctx, revs, nil, ops...)
	if err != nil {
		return nil, err
	}
	if !ok {
		return nil, ErrConflict
	}
	return out, nil
}

// ErrNotFound is a VM or host the fleet does not know.
var ErrNotFound = errors.New("not in the fleet")

// Remove deletes the VM's spec and placement: its owner stops it, removes
// its local state and then its status. A VM placed on no live host loses
// its status at once.
func (s *Store) Remove(ctx context.Context, name string) error {
	snap, err := s.Load(ctx, false)
	if err != nil {
		return err
	}
	rec, ok := snap.VMs[name]
	if !ok {
		return fmt.Errorf("vm %s: %w", name, ErrNotFound)
	}
	p := snap.Placements[name]
	ops := []clientv3.Op{clientv3.OpDelete(s.key("vms", name)), clientv3.OpDelete(s.key("placement", name))}
	if _, alive := snap.Hosts[p.Value.Host]; p.Rev == 0 || !alive {
		ops = append(ops, clientv3.OpDelete(s.key("status", name)))
	} else {
		ops = append(ops, clientv3.OpPut(s.key("status", name), mustJSON(Status{Host: p.Value.Host, State: StateRemoving, Updated: time.Now().UTC()})))
	}
	ok, err = s.cas(ctx, map[string]int64{s.key("vms", name): rec.Rev, s.key("placement", name): p.Rev}, nil, ops...)
	if err != nil {
		return err
	}
	if !ok {
		return ErrConflict
	}
	return nil
}

// Cordon marks the host as draining (on) or taking VMs again (off). The
// mark is not under the host's lease: a drained host stays drained across
// its agent's restarts until uncordoned.
func (s *Store) Cordon(ctx context.Context, host string, on bool) error {
	ctx, cancel := s.ctx(ctx)
	defer cancel()
	var err error
	if on {
		_, err = s.c.Put(ctx, s.key("cordon", host), time.Now().UTC().Format(time.RFC3339))
	} else {
		_, err = s.c.Delete(ctx, s.key("cordon", host))
	}
	return s.explain(err)
}

// place commits a first placement: only if the VM's spec is still the one
// decided on, nobody placed it meanwhile, and guard holds.
func (s *Store) place(ctx context.Context, rec Entry[VMRecord], host string, guard []clientv3.Cmp) (bool, error) {
	name := rec.Value.Name
	return s.cas(ctx, map[string]int64{s.key("vms", name): rec.Rev, s.key("placement", name): 0}, guard,
		clientv3.OpPut(s.key("placement", name), mustJSON(Placement{Host: host, Epoch: 1})),
		clientv3.OpPut(s.key("status", name), mustJSON(Status{Host: host, State: StatePending, Reason: "placed; the agent starts it", Updated: time.Now().UTC()})))
}

// movePlacement swaps the placement from cur (at rev) to next, if guard
// holds.
func (s *Store) movePlacement(ctx context.Context, name string, rev int64, next Placement, st *Status, guard []clientv3.Cmp) (bool, error) {
	ops := []clientv3.Op{clientv3.OpPut(s.key("placement", name), mustJSON(next))}
	if st != nil {
		st.Updated = time.Now().UTC()
		ops = append(ops, clientv3.OpPut(s.key("status", name), mustJSON(*st)))
	}
	return s.cas(ctx, map[string]int64{s.key("placement", name): rev}, guard, ops...)
}

// deleteStatus drops a removed VM's status, once its owner cleaned up.
func (s *Store) deleteStatus(ctx context.Context, name string) error {
	ctx, cancel := s.ctx(ctx)
	defer cancel()
	_, err := s.c.Delete(ctx, s.key("status", name))
	return s.explain(err)
}

// PutHost registers a host under lease (0: none, for tools and tests that
// stand in for an agent).
func (s *Store) PutHost(ctx context.Context, h Host, lease clientv3.LeaseID) error {
	ctx, cancel := s.ctx(ctx)
	defer cancel()
	var opts []clientv3.OpOption
	if lease != 0 {
		opts = append(opts, clientv3.WithLease(lease))
	}
	_, err := s.c.Put(ctx, s.key("hosts", h.Name), mustJSON(h), opts...)
	return s.explain(err)
}
