package vmstore

import (
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"slices"
	"syscall"
	"time"
)

// The operation journal: a command that takes several steps on a running
// VM (a hot-plug, a resize, a migration, a restart) writes its intent
// before it acts and each step as it is done, in ROOT/records/NAME/op.json,
// synced to disk. It removes the file when it ends. A command that finds
// the file while no vmsup holds the VM's lock knows the writer died
// between two steps, and finishes or rolls back the operation from QEMU's
// and systemd's real state (the supervisor's recovery), reading the intent.
//
// The file has a fixed size, allocated when the operation begins, and each
// update rewrites it in place: a full filesystem cannot stop the journal
// once the operation has begun. A reserve file allocated beside it gives
// back room for the operation's last record writes if the filesystem fills
// meanwhile (a record write that finds the filesystem full removes it and
// tries again: Paths.writeRecord).

// opSize is the journal file's size: intents are small (a disk or NIC spec,
// a migration's peers); a larger one is refused when it is written.
const opSize = 256 << 10

// reserveSize is given back for the records an operation writes at its end.
const reserveSize = 1 << 20

// Op is one operation's journal.
type Op struct {
	Kind    string          `json:"kind"`
	PID     int             `json:"pid"`
	Started time.Time       `json:"started"`
	Done    []string        `json:"done"`             // steps completed, in order
	Intent  json.RawMessage `json:"intent,omitempty"` // what the operation means to do, by kind

	f       *os.File
	reserve string
}

// ErrOpPending is an unfinished operation found where a new one would begin.
var ErrOpPending = errors.New("an unfinished operation is pending")

func (p Paths) opFile() string      { return filepath.Join(p.Records, "op.json") }
func (p Paths) reserveFile() string { return filepath.Join(p.Records, "op.reserve") }

// BeginOp records that operation kind begins on the VM, with its intent,
// before anything is done. The caller holds the VM's lock. An operation
// already recorded (its command died) must be recovered first.
func (s Store) BeginOp(name, kind string, intent any) (*Op, error) {
	p := s.Paths(name)
	if err := p.MakeRecords(); err != nil {
		return nil, err
	}
	if _, err := os.Stat(p.opFile()); err == nil {
		return nil, fmt.Errorf("%w (%s): recover it first", ErrOpPending, p.opFile())
	}
	f, err := os.OpenFile(p.opFile(), os.O_CREATE|os.O_EXCL|os.O_RDWR|syscall.O_CLOEXEC, 0o600)
	if err != nil {
		return nil, err
	}
	o := &Op{Kind: kind, PID: os.Getpid(), Started: time.Now().UTC(), f: f, reserve: p.reserveFile()}
	fail := func(err error) (*Op, error) {
		f.Close()
		os.Remove(p.opFile())
		os.Remove(o.reserve)
		return nil, err
	}
	if err := allocate(f, opSize); err != nil {
		return fail(fmt.Errorf("journal: %w", err))
	}
	if err := allocateFile(o.reserve, reserveSize); err != nil {
		return fail(fmt.Errorf("journal reserve: %w", err))
	}
	if intent != nil {
		if o.Intent, err = json.Marshal(intent); err != nil {
			return fail(err)
		}
	}
	if err := o.write(); err != nil {
		return fail(err)
	}
	return o, syncDir(p.Records)
}

// Step records that step is done.
func (o *Op) Step(step string) error {
	o.Done = append(o.Done, step)
	return o.write()
}

// SetIntent replaces the intent (an operation learns more as it goes: the
// root port it got, the destination's record).
func (o *Op) SetIntent(intent any) error {
	b, err := json.Marshal(intent)
	if err != nil {
		return err
	}
	o.Intent = b
	return o.write()
}

// Has reports whether step is done.
func (o *Op) Has(step string) bool { return slices.Contains(o.Done, step) }

// End removes the journal: the operation is over, done or undone.
func (o *Op) End() error {
	o.Close()
	os.Remove(o.reserve)
	dir := filepath.Dir(o.reserve)
	if err := os.Remove(filepath.Join(dir, "op.json")); err != nil && !errors.Is(err, os.ErrNotExist) {
		return err
	}
	if err := syncDir(dir); err != nil && !errors.Is(err, os.ErrNotExist) {
		return err // (the VM's records may be gone with it)
	}
	return nil
}

// write rewrites the journal in place, padded to its size, and syncs it.
func (o *Op) write() error {
	b, err := json.Marshal(o)
	if err != nil {
		return err
	}
	if len(b)+1 > opSize {
		return fmt.Errorf("journal: the operation's record is %d bytes, more than %d", len(b), opSize)
	}
	buf := make([]byte, opSize)
	copy(buf, b)
	for i := len(b); i < opSize; i++ {
		buf[i] = ' '
	}
	if o.f == nil {
		return errors.New("journal: the operation's file is closed")
	}
	if _, err := o.f.WriteAt(buf, 0); err != nil {
		return fmt.Errorf("journal: %w", err)
	}
	return o.f.Sync()
}

// KindUnwritten is the kind of a journal whose file was made but never
// written: its command was killed as it began, before it did anything.
const KindUnwritten = "unwritten"

// PendingOp returns the VM's unfinished operation, nil if there is none,
// open for writing: its recovery journals the steps it takes, through the
// same file (allocated when the operation began), so that recovery cut
// short is itself recovered from where it got. Its End removes it.
func (s Store) PendingOp(name string) (*Op, error) {
	p := s.Paths(name)
	f, err := os.OpenFile(p.opFile(), os.O_RDWR|syscall.O_CLOEXEC, 0)
	if errors.Is(err, os.ErrNotExist) {
		return nil, nil
	}
	if err != nil {
		return nil, err
	}
	b, err := io.ReadAll(f)
	if err != nil {
		f.Close()
		return nil, err
	}
	var o Op
	rec := bytes.TrimRight(b, " \x00")
	switch err := json.Unmarshal(rec, &o); {
	case len(rec) == 0:
		// Made but never written: its command was killed inside BeginOp,
		// before the operation was under way, so nothing of it happened.
		o = Op{Kind: KindUnwritten}
	case err != nil:
		// Written, but not readable (another program's bytes, a disk
		// fault): what the operation did cannot be known.
		o = Op{Kind: "unreadable"}
	}
	o.f, o.reserve = f, p.reserveFile()
	if fi, err := f.Stat(); err == nil && fi.Size() < opSize {
		// Made before it had its size (or cut short): give it its room.
		_ = allocate(f, opSize)
	}
	return &o, nil
}

// Close lets go of a pending operation's file without ending it.
func (o *Op) Close() {
	if o.f != nil {
		o.f.Close()
		o.f = nil
	}
}

// allocate makes f size bytes long with its blocks allocated.
func allocate(f *os.File, size int64) error {
	if err := syscall.Fallocate(int(f.Fd()), 0, 0, size); err != nil {
		if !errors.Is(err, syscall.EOPNOTSUPP) {
			return err
		}
		// A filesystem without fallocate: write the bytes instead.
		if _, err := f.WriteAt(make([]byte, size), 0); err != nil {
			return err
		}
	}
	return nil
}

func allocateFile(path string, size int64) error {
	f, err := os.OpenFile(path, os.O_CREATE|os.O_WRONLY|syscall.O_CLOEXEC, 0o600)
	if err != nil {
		return err
	}
	defer f.Close()
	return allocate(f, size)
}

func syncDir(dir string) error {
	d, err := os.Open(dir)
	if err != nil {
		return err
	}
	defer d.Close()
	return d.Sync()
}
