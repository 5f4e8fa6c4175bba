// Package operation is vmsup's kernel of operations: every command that
// changes a VM in several steps runs through it. The kernel takes the VM's
// lock, settles an operation a killed command left (with the recoverer
// registered for its kind, which decides from QEMU's and systemd's real
// state), journals the new operation's intent and each of its steps
// through one point (Op.Step, which is also where faults are injected and
// steps traced), and ends it.
//
// It does not know any operation: kinds, their steps and their recoverers
// are declared beside the code that runs them and registered by it.
package operation

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"log/slog"
	"slices"
	"sync"
	"time"

	"github.com/vmsup/vmsup/internal/lifecycle/steps"
	"github.com/vmsup/vmsup/internal/vm/vmerr"
	"github.com/vmsup/vmsup/internal/vm/vmstore"
)

// Kind names an operation in the journal.
type Kind string

// Step names a step of an operation in the journal: done when recorded.
type Step string

// Recoverer finishes or undoes an operation of its kind whose command died,
// from the VM's real state and the operation's journal; note says what it
// did. It runs under the VM's lock and may journal further steps in o.
type Recoverer func(ctx context.Context, vm string, o *Op) (note string, err error)

// Options configure a Kernel.
type Options struct {
	Store vmstore.Store
	// Wait: a command on a VM another holds waits for it (until its
	// context ends) instead of failing as busy.
	Wait bool
	// After sees every step of every operation once it is journaled: the
	// one point where faults are injected and steps traced.
	After func(vm, step string)
	// Logger logs what recovery did and journal writes that failed.
	Logger *slog.Logger
	// GiveUp makes vm safe when its journal names a kind no recoverer
	// knows (an older or newer vmsup's): the VM off, its disks and records
	// untouched. Nil: there is nothing to stop (the journal still ends).
	GiveUp func(ctx context.Context, vm string) error
}

// ErrUnregistered is what Begin refuses: a kind with no recoverer would
// leave a journal that nothing can settle after a kill.
var ErrUnregistered = errors.New("has no recoverer registered")

// Kernel runs the operations of the VMs of one state root.
type Kernel struct {
	o   Options
	mu  sync.RWMutex
	rec map[Kind]Recoverer
}

// New returns a kernel with no recoverer registered yet.
func New(o Options) *Kernel {
	if o.Logger == nil {
		o.Logger = slog.New(slog.DiscardHandler)
	}
	return &Kernel{o: o, rec: map[Kind]Recoverer{}}
}

// Register makes r the recoverer of kind (one per kind; a second replaces
// the first).
func (k *Kernel) Register(kind Kind, r Recoverer) {
	k.mu.Lock()
	defer k.mu.Unlock()
	k.rec[kind] = r
}

// Kinds lists the registered kinds, sorted.
func (k *Kernel) Kinds() []Kind {
	k.mu.RLock()
	defer k.mu.RUnlock()
	var out []Kind
	for kind := range k.rec {
		out = append(out, kind)
	}
	slices.Sort(out)
	return out
}

// Op is one operation's journal, as its command (Begin) or its recoverer
// (Settle) holds it.
type Op struct {
	k  *Kernel
	vm string
	j  *vmstore.Op
	by string // the command settling it (Settle), "" for its own
	// links are the VMs this operation makes (Concerns), unlinked at End.
	links []string
}

// SettledBy is the command settling the operation ("" while its own
// command runs it).
func (o *Op) SettledBy() string { return o.by }

// Kind is the operation's kind.
func (o *Op) Kind() Kind { return Kind(o.j.Kind) }

// Started is when the operation began.
func (o *Op) Started() time.Time { return o.j.Started }

// PID is the process that began it.
func (o *Op) PID() int { return o.j.PID }

// Step journals that s is done, then lets the kernel's After see it. A
// journal that cannot be written is logged: the step happened either way.
func (o *Op) Step(s Step) {
	if err := o.j.Step(string(s)); err != nil {
		o.k.o.Logger.Warn("journal", "vm", o.vm, "step", string(s), "err", err)
	}
	if o.k.o.After != nil {
		o.k.o.After(o.vm, string(s))
	}
}

// After is Step for a list of named steps (steps.Run): each step's name is
// journaled when it is done.
func (o *Op) After() func(vm, step string) {
	return func(_, step string) { o.Step(Step(step)) }
}

// Has reports whether step s is done.
func (o *Op) Has(s Step) bool { return o.j.Has(string(s)) }

// Done lists the steps done, in order.
func (o *Op) Done() []Step {
	out := make([]Step, len(o.j.Done))
	for i, s := range o.j.Done {
		out[i] = Step(s)
	}
	return out
}

// SetIntent replaces the intent (an operation learns more as it goes).
func (o *Op) SetIntent(intent any) error { return o.j.SetIntent(intent) }

// End removes the journal: the operation is over, done or undone.
func (o *Op) End() error {
	for _, n := range o.links {
		o.k.o.Store.UnlinkOp(n, o.vm)
	}
	return o.j.End()
}

// Concerns notes that the operation makes VM vm too (a clone, journaled on
// its template): until it ends, the next command on vm settles it as well.
func (o *Op) Concerns(vm string) error {
	if err := o.k.o.Store.LinkOp(vm, o.vm); err != nil {
		return vmerr.Wrap(vm, err)
	}
	o.links = append(o.links, vm)
	return nil
}

// IntentOf decodes the operation's intent.
func IntentOf[T any](o *Op) (T, error) {
	var in T
	if len(o.j.Intent) == 0 {
		return in, errors.New("the journal has no intent")
	}
	err := json.Unmarshal(o.j.Intent, &in)
	return in, err
}

// Lock is a VM's lock as a command holds it.
type Lock struct{ fl *vmstore.FileLock }

// Unlock lets the VM go (nothing for a lock its caller's caller holds).
func (l *Lock) Unlock() { l.fl.Unlock() }

// heldLock marks a context whose command holds a VM's lock across several
// operations, which then run under it instead of taking it again.
type heldLock struct{ vm string }

// Holding returns ctx carrying the lock its command holds on vm.
func Holding(ctx context.Context, vm string) context.Context {
	return context.WithValue(ctx, heldLock{vm}, true)
}

// Lock takes vm's lock for command by (waiting when the kernel waits), then
// settles what a killed command left; note says what that was ("" for
// nothing). In a context Holding the lock it borrows it.
func (k *Kernel) Lock(ctx context.Context, vm, by string) (*Lock, string, error) {
	return k.lock(ctx, vm, by, k.o.Wait)
}

// LockWaiting is Lock waiting for the lock whatever the kernel's Wait (a
// guardian waits for the command it guards).
func (k *Kernel) LockWaiting(ctx context.Context, vm, by string) (*Lock, string, error) {
	return k.lock(ctx, vm, by, true)
}

func (k *Kernel) lock(ctx context.Context, vm, by string, wait bool) (*Lock, string, error) {
	if ctx.Value(heldLock{vm}) != nil {
		return &Lock{vmstore.Borrowed()}, "", nil // settled when the command took it
	}
	fl, err := k.o.Store.Lock(ctx, vm, by, wait)
	if err != nil {
		return nil, "", err
	}
	note, err := k.Settle(ctx, vm, by)
	if err != nil {
		fl.Unlock()
		return nil, "", err
	}
	return &Lock{fl}, note, nil
}

// refuse fails closed: an operation whose kind has no recoverer is not
// begun (a kill would leave a journal nothing can settle).
func (k *Kernel) refuse(vm string, kind Kind) error {
	k.mu.RLock()
	defer k.mu.RUnlock()
	if k.rec[kind] != nil {
		return nil
	}
	return fmt.Errorf("vm %q: operation %q %w: refused before anything was done (a bug in vmsup)", vm, kind, ErrUnregistered)
}

// Begin journals an operation's intent before it acts; the caller holds
// vm's lock. An operation a killed command left is settled first. A kind
// with no recoverer registered is refused.
func (k *Kernel) Begin(ctx context.Context, vm string, kind Kind, intent any) (*Op, error) {
	if err := k.refuse(vm, kind); err != nil {
		return nil, err
	}
	if _, err := k.Settle(ctx, vm, string(kind)); err != nil {
		return nil, err
	}
	j, err := k.o.Store.BeginOp(vm, string(kind), intent)
	if err != nil {
		return nil, fmt.Errorf("%w (nothing was done)", err)
	}
	return &Op{k: k, vm: vm, j: j}, nil
}

// BeginGuarded is Begin for an operation with a guardian: guard starts it
// after a pending operation is settled and before the journal is written
// (no moment has a journal without a guardian to settle it), and returns
// what ends it, which the caller calls once the journal ended.
func (k *Kernel) BeginGuarded(ctx context.Context, vm string, kind Kind, intent any, guard func() (stop func())) (*Op, func(), error) {
	if err := k.refuse(vm, kind); err != nil {
		return nil, nil, err
	}
	if _, err := k.Settle(ctx, vm, string(kind)); err != nil {
		return nil, nil, err
	}
	stop := guard()
	j, err := k.o.Store.BeginOp(vm, string(kind), intent)
	if err != nil {
		stop()
		return nil, nil, fmt.Errorf("%w (nothing was done)", err)
	}
	return &Op{k: k, vm: vm, j: j}, stop, nil
}

// Run is an operation made of a list of named steps: begun, each step
// journaled as it is done, ended when they are all done or undone. A
// failed step's error names it (steps.Error).
func (k *Kernel) Run(ctx context.Context, vm string, kind Kind, intent any, list []steps.Step) error {
	o, err := k.Begin(ctx, vm, kind, intent)
	if err != nil {
		return err
	}
	defer o.End()
	_, err = steps.Run(ctx, vm, list, o.After())
	return err
}

// Pending returns vm's unfinished operation (nil for none), for a command
// that only looks at it; Close it after.
func (k *Kernel) Pending(vm string) (*Op, error) {
	j, err := k.o.Store.PendingOp(vm)
	if err != nil || j == nil {
		return nil, err
	}
	return &Op{k: k, vm: vm, j: j}, nil
}

// Close lets go of a pending operation's journal without ending it.
func (o *Op) Close() { o.j.Close() }

// Settle finishes or undoes vm's unfinished operation, if a command left
// one, with its kind's recoverer; the caller holds vm's lock (so that
// command is gone). by is the command settling it. The note says what was
// done ("" when there was nothing); an operation that could not be settled
// stays journaled for the next command, and the error says why. One whose
// kind no recoverer knows is given up (giveUp): an error either way.
func (k *Kernel) Settle(ctx context.Context, vm, by string) (string, error) {
	// (The caller holds vm's lock: the linked recovery borrows it.)
	linked, err := k.settleLinked(Holding(ctx, vm), vm, by)
	if err != nil {
		return "", err
	}
	o, err := k.Pending(vm)
	if err != nil {
		return "", err
	}
	if o == nil {
		return linked, nil
	}
	defer o.Close()
	o.by = by
	k.mu.RLock()
	r := k.rec[o.Kind()]
	k.mu.RUnlock()
	if o.Kind() == Kind(vmstore.KindUnwritten) {
		return k.dropUnwritten(o)
	}
	if r == nil {
		return "", k.giveUp(ctx, o)
	}
	note, err := r(ctx, vm, o)
	if err != nil {
		return "", fmt.Errorf("vm %q: an interrupted %s (pid %d, %s) could not be recovered: %w",
			vm, o.Kind(), o.PID(), o.Started().Format("15:04:05"), err)
	}
	if err := o.End(); err != nil {
		return note, fmt.Errorf("vm %q: journal: %w", vm, err)
	}
	k.o.Logger.Warn("recovered an interrupted operation", "vm", vm, "op", string(o.Kind()), "pid", o.PID(),
		"done", o.j.Done, "note", note, "by", by)
	return fmt.Sprintf("recovered an interrupted %s: %s", o.Kind(), note), nil
}

// dropUnwritten ends a journal its command left unwritten, killed inside
// Begin before the operation was under way: there is nothing to finish or
// undo, and the VM is left as it is (a give-up would stop a guest that
// nothing touched).
func (k *Kernel) dropUnwritten(o *Op) (string, error) {
	if err := o.End(); err != nil {
		return "", fmt.Errorf("vm %q: an empty journal: %w", o.vm, err)
	}
	k.o.Logger.Warn("dropped an empty journal (its command was killed as it began)", "vm", o.vm, "by", o.by)
	return "dropped an empty journal (its command was killed as it began; nothing of it happened)", nil
}

// giveUp settles a journal whose kind no recoverer knows (a vmsup of
// another version left it): nothing can say what it did, so the VM is
// stopped (GiveUp) with its disks untouched and the journal ends; the
// error says so. A VM that could not be stopped keeps its journal.
func (k *Kernel) giveUp(ctx context.Context, o *Op) error {
	what := fmt.Sprintf("vm %q: an interrupted %s (pid %d, %s)", o.vm, o.Kind(), o.PID(), o.Started().Format("15:04:05"))
	if k.o.GiveUp != nil {
		if err := k.o.GiveUp(ctx, o.vm); err != nil {
			return fmt.Errorf("%s %w in this vmsup, and the VM could not be stopped (the journal stays): %w", what, ErrUnregistered, err)
		}
	}
	if err := o.End(); err != nil {
		return fmt.Errorf("%s %w in this vmsup: journal: %w", what, ErrUnregistered, err)
	}
	k.o.Logger.Warn("gave up an interrupted operation of an unknown kind", "vm", o.vm, "op", string(o.Kind()),
		"pid", o.PID(), "done", o.j.Done)
	if k.o.GiveUp == nil {
		return fmt.Errorf("%s %w in this vmsup: gave it up (nothing was undone)", what, ErrUnregistered)
	}
	return fmt.Errorf("%s %w in this vmsup: gave it up: the VM is off, its disks and records untouched; "+
		"check the guest, then start it again", what, ErrUnregistered)
}

// SettleIfFree is Settle for a command that does not take the VM's lock
// (status): it settles only when no other command holds the lock, which
// means the operation's command is gone.
func (k *Kernel) SettleIfFree(ctx context.Context, vm string) (string, error) {
	o, err := k.Pending(vm)
	if err == nil && o == nil && k.o.Store.OpLink(vm) != "" {
		return k.settleLinked(ctx, vm, "status")
	}
	if err != nil || o == nil {
		return "", err
	}
	o.Close()
	fl, err := k.o.Store.TryLock(ctx, vm, "recover")
	if err != nil || fl == nil {
		return "", err // the operation is still going
	}
	defer fl.Unlock()
	return k.Settle(ctx, vm, "status")
}

// settleLinked settles the operation of another VM that makes vm (Op.Concerns),
// when no command holds that VM (its command is gone), and drops the link
// once that VM has no operation pending.
func (k *Kernel) settleLinked(ctx context.Context, vm, by string) (string, error) {
	on := k.o.Store.OpLink(vm)
	if on == "" || on == vm {
		return "", nil
	}
	fl, err := k.o.Store.TryLock(ctx, on, "recover")
	if err != nil || fl == nil {
		return "", err // that operation is still going (or it is this command's own)
	}
	defer fl.Unlock()
	note, err := k.Settle(ctx, on, by)
	if err != nil {
		return "", err
	}
	if p, _ := k.Pending(on); p != nil {
		p.Close()
		return note, nil
	}
	k.o.Store.UnlinkOp(vm, on)
	if note != "" {
		note = fmt.Sprintf("(on %s) %s", on, note)
	}
	return note, nil
}
