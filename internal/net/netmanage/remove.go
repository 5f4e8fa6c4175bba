package netmanage

import (
	"context"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"slices"

	"github.com/vmsup/vmsup/internal/lifecycle/operation"
	"github.com/vmsup/vmsup/internal/vm/vmstore"
)

// A network's rm runs through the operation kernel (internal/lifecycle/operation),
// journaled under networks/.ops/records/NAME: a killed rm left the network
// defined, its dnsmasq stopped and its bridge up until rm ran again. The
// next command on the network (any that takes its lock, and ls) finishes
// it: rm was decided, with no NIC on the network, before anything was done.

// kindRemove is a network rm in the journal.
const kindRemove operation.Kind = "network-rm"

// The steps of a network rm, journaled as each is done.
const (
	stepDnsmasq operation.Step = "dnsmasq-stopped"
	stepNAT     operation.Step = "nat-removed"
	stepBridge  operation.Step = "bridge-deleted"
	stepForget  operation.Step = "forgotten"
)

// rmIntent is what a recoverer needs once the definition may be gone.
type rmIntent struct {
	Bridge string `json:"bridge"`
}

// opsStore keeps the networks' journals, apart from the VMs' (a network
// and a VM may share a name). Names lists only directories with a
// definition, so ".ops" is none.
func (m *Manager) opsStore() vmstore.Store { return vmstore.Store{Root: filepath.Join(m.Dir, ".ops")} }

// ops is the kernel of the networks' operations.
func (m *Manager) ops() *operation.Kernel {
	k := operation.New(operation.Options{Store: m.opsStore(), After: m.AfterStep, Logger: m.logger()})
	k.Register(kindRemove, m.recoverRemove)
	return k
}

// Kinds are the kinds of the networks' operations that have a recoverer
// (supervisor's TestEveryKindHasARecoverer checks every declared one).
func (m *Manager) Kinds() []string {
	var out []string
	for _, k := range m.ops().Kinds() {
		out = append(out, string(k))
	}
	return out
}

// settle finishes what a killed command left on the network; the caller
// holds its lock.
func (m *Manager) settle(ctx context.Context, name string) (string, error) {
	note, err := m.ops().Settle(ctx, name, "network")
	if err != nil {
		return "", fmt.Errorf("network %q: %w", name, err)
	}
	m.dropJournalDir(name)
	return note, nil
}

// settleIfFree is settle for a command that does not take the lock (ls):
// only when no other command holds it. Best effort: ls shows the network
// as it is when it cannot.
func (m *Manager) settleIfFree(ctx context.Context, name string) {
	o, err := m.ops().Pending(name)
	if err != nil || o == nil {
		return
	}
	o.Close()
	lk, err := m.takeLock(ctx, name, false)
	if err != nil || lk == nil {
		return
	}
	defer lk.Unlock()
	if _, err := m.settle(ctx, name); err != nil {
		m.logger().Warn("network settle", "network", name, "err", err)
	}
}

// dropJournalDir removes the network's empty journal directory.
func (m *Manager) dropJournalDir(name string) {
	os.Remove(m.opsStore().Paths(name).Records)
}

// Remove tears the network down and forgets it; refused (an *InUseError)
// while a VM has a NIC on it. An rm a killed command left is finished.
func (m *Manager) Remove(ctx context.Context, name string) error {
	unlock, note, err := m.lock(ctx, name)
	if err != nil {
		return err
	}
	defer unlock()
	n, err := m.Get(name)
	if errors.Is(err, ErrNotFound) && note != "" {
		return nil // the rm a killed command began, finished by settle
	}
	if err != nil {
		return err
	}
	atts, err := m.attachments(name)
	if err != nil {
		return err
	}
	if len(atts) > 0 {
		var vms []string
		for _, a := range atts {
			if !slices.Contains(vms, a.VM) {
				vms = append(vms, a.VM)
			}
		}
		slices.Sort(vms)
		return &InUseError{Network: name, VMs: vms}
	}
	o, err := m.ops().Begin(ctx, name, kindRemove, rmIntent{Bridge: n.Bridge})
	if err != nil {
		return fmt.Errorf("network %q: %w", name, err)
	}
	err = m.removeSteps(ctx, o, n)
	// A failed step ends the journal too: the error says what is left,
	// and rm may be run again.
	err = errors.Join(err, o.End())
	m.dropJournalDir(name)
	if err != nil {
		return fmt.Errorf("network %q: %w", name, err)
	}
	return nil
}

// removeSteps tears n down, each step journaled in o (each one idempotent:
// a recoverer runs them all again).
func (m *Manager) removeSteps(ctx context.Context, o *operation.Op, n *Network) error {
	for _, s := range []struct {
		step operation.Step
		do   func() error
	}{
		{stepDnsmasq, func() error { return m.stopDnsmasq(ctx, n.Name) }},
		{stepNAT, func() error { return removeNAT(n.Name) }},
		{stepBridge, func() error { return deleteBridge(n.Bridge) }},
		{stepForget, func() error { return os.RemoveAll(m.dir(n.Name)) }},
	} {
		if err := s.do(); err != nil {
			return err
		}
		o.Step(s.step)
	}
	return nil
}

// recoverRemove finishes a killed rm: every step again, from the
// definition if it is still there, else from the journal's bridge.
func (m *Manager) recoverRemove(ctx context.Context, name string, o *operation.Op) (string, error) {
	in, err := operation.IntentOf[rmIntent](o)
	if err != nil {
		return "", err
	}
	n := &Network{Name: name, Bridge: in.Bridge}
	if def, err := m.Get(name); err == nil {
		n = def
	}
	if err := m.removeSteps(ctx, o, n); err != nil {
		return "", err
	}
	return fmt.Sprintf("finished removing network %s (bridge %s)", name, n.Bridge), nil
}
