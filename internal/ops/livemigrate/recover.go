package livemigrate

import (
	"context"
	"fmt"
	"os"
	"path/filepath"
	"sort"
	"time"

	"github.com/vmsup/vmsup/internal/lifecycle/operation"
	"github.com/vmsup/vmsup/internal/machine"
	"github.com/vmsup/vmsup/internal/vm/vmstore"
	"github.com/vmsup/vmsup/qmp"
	"github.com/vmsup/vmsup/units"
)

// Settling a migration whose vmsup died: exactly one QEMU may run the
// guest afterwards. Which one is read from the QEMUs themselves (their run
// state), systemd (their units), and, across hosts, the destination's own
// answer (a query over the same transport) or, failing that, the write
// locks on the shared disks.
//
// Each recoverer looks, decides and acts apart, after libvirt's
// qemuProcessRecoverJob: a pure decide function maps what was seen (the
// journal's steps, the intent, the units' and the QEMUs' states) to a
// typed action, and a short executor does it. An action may be a look
// (ask the destination, read the locks): it is taken and the decision made
// again, so what is asked, and when, is decided too (asking a destination
// settles its side, so it is asked only when nothing else can say). What
// is looked at comes through the small interfaces below: the decisions are
// table-tested against stand-ins.

// Steps of the source side of a migration, as journaled and as AfterStep
// sees them.
const (
	stepMigPrepared     operation.Step = "migrate-prepared"      // the destination QEMU waits for the stream
	stepMigCompleted    operation.Step = "migrate-completed"     // the stream completed
	stepMigFinalizeSent operation.Step = "migrate-finalize-sent" // from here the destination may run the guest
	stepMigFinalized    operation.Step = "migrate-finalized"     // the destination runs the guest
	stepMigQuitSent     operation.Step = "migrate-quit-sent"     // the source's QEMU was told to quit
	stepMigSourceQuit   operation.Step = "migrate-source-quit"   // the source's QEMU is gone
)

// MigrateSteps are the steps of the source side of a migration, in order,
// as AfterStep sees them.
func MigrateSteps() []string {
	return stepNames(stepMigPrepared, stepMigCompleted, stepMigFinalizeSent, stepMigFinalized, stepMigQuitSent, stepMigSourceQuit)
}

// migrateIntent is the source side's journal of a migration.
type migrateIntent struct {
	Local       bool     `json:"local"`
	To          string   `json:"to,omitempty"`
	Transport   []string `json:"transport,omitempty"`
	Unit        string   `json:"unit"`                // the source QEMU's
	DestUnit    string   `json:"dest_unit,omitempty"` // local: the new QEMU's
	Markers     []string `json:"markers,omitempty"`
	RelaySock   string   `json:"relay_sock,omitempty"`
	StopAndCopy bool     `json:"stop_and_copy,omitempty"`
	Autostart   bool     `json:"autostart,omitempty"`
	// Storage migration (storage_out.go): the disks copied to the
	// destination, whether they stay here once it runs the guest, and
	// the NBD relay's socket.
	Copies    []string `json:"copies,omitempty"`
	CopyNames []string `json:"copy_names,omitempty"`
	KeepDisks bool     `json:"keep_disks,omitempty"`
	NBDSock   string   `json:"nbd_sock,omitempty"`
}

// unitStates reads a unit's state from systemd (a *units.Manager is one).
type unitStates interface {
	Status(ctx context.Context, unit string) (units.Status, error)
}

// qemuStates reads the run state of the QEMU listening at a monitor
// socket, "" when none answers (machine.Env is one).
type qemuStates interface {
	RunStateAt(ctx context.Context, sock string) qmp.RunState
}

// elsewhere is what a source-side recovery looks at beyond systemd: the
// source QEMU's run state (its monitor), whether the destination's vmsup
// says the guest runs there (over the migration's transport), whether
// another QEMU holds the shared disks' write locks. known is false when a
// look cannot say. The Migrator is one.
type elsewhere interface {
	sourceState(ctx context.Context, name string) (qmp.RunState, error)
	askDestination(ctx context.Context, name string, in migrateIntent) (runs, known bool)
	lockedElsewhere(name string, copied []string) (locked, known bool)
}

var (
	_ unitStates = (*units.Manager)(nil)
	_ qemuStates = (*machine.Env)(nil)
	_ elsewhere  = (*Migrator)(nil)
)

// answer is what a look that may not be able to say found.
type answer uint8

const (
	notAsked      answer = iota
	answerYes            // it runs the guest; another QEMU holds the locks
	answerNo             // it does not; none does
	answerUnknown        // it cannot say
)

func answerOf(yes, known bool) answer {
	switch {
	case !known:
		return answerUnknown
	case yes:
		return answerYes
	}
	return answerNo
}

func (mg *Migrator) recoverMigrateOut(ctx context.Context, name string, op *operation.Op) (string, error) {
	in, err := operation.IntentOf[migrateIntent](op)
	if err != nil {
		return "", err
	}
	for _, mk := range in.Markers {
		os.Remove(mk)
	}
	if in.RelaySock != "" {
		os.Remove(in.RelaySock)
	}
	os.Remove(mg.paths(name).StoppedByMigration())
	sd, err := mg.env.Systemd(ctx)
	if err != nil {
		return "", err
	}
	src, err := sd.Status(ctx, in.Unit)
	if err != nil {
		return "", err
	}
	if in.Local {
		return mg.settleLocal(ctx, name, in, sd, src)
	}
	return mg.settleRemote(ctx, name, in, op, sd, src)
}

// destAnswerTimeout bounds how long recovery waits for a destination QEMU
// that does not answer its monitor while its unit is up: one still
// starting (its sockets not bound yet), or one ending (its stream broke, so
// it exits; its unit goes once its stop-post hook ran).
const destAnswerTimeout = 30 * time.Second

// destState asks the destination QEMU of unit for its run state at the
// socket sock names (asked again each time: a hand-over renames it); ""
// when its unit ended, before or while this waited, or when it is a
// cpr-transfer destination still waiting for its source's state (no
// monitor yet: no guest). A QEMU whose unit
// stays up and that does not answer within destAnswerTimeout is an error:
// it may run the guest, and recovery never guesses (the guardian tries
// again).
func destState(ctx context.Context, u unitStates, q qemuStates, unit string, sock func() string) (qmp.RunState, error) {
	deadline := time.Now().Add(destAnswerTimeout)
	for {
		st, err := u.Status(ctx, unit)
		if err != nil {
			return "", err
		}
		if st.Gone() {
			return "", nil
		}
		if state := q.RunStateAt(ctx, sock()); state != "" {
			return state, nil
		}
		if waitingForCPR(sock()) {
			return "", nil // no guest here: it waits for its source's state
		}
		if time.Now().After(deadline) {
			return "", fmt.Errorf("the incoming QEMU (%s) does not answer its monitor", unit)
		}
		select {
		case <-ctx.Done():
			return "", ctx.Err()
		case <-time.After(200 * time.Millisecond):
		}
	}
}

// incomingDir is the newest incoming directory of a destination QEMU.
func incomingDir(p vmstore.Paths) string {
	dirs, _ := filepath.Glob(filepath.Join(p.Dir, "incoming-*"))
	sort.Slice(dirs, func(i, j int) bool { return modTime(dirs[i]).Before(modTime(dirs[j])) })
	if len(dirs) == 0 {
		return ""
	}
	return dirs[len(dirs)-1]
}

func modTime(p string) time.Time {
	fi, err := os.Stat(p)
	if err != nil {
		return time.Time{}
	}
	return fi.ModTime()
}
