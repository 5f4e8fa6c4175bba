package migwire

import (
	"bufio"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"sync"
	"time"

	"github.com/vmsup/vmsup/qmp"
	"github.com/vmsup/vmsup/spec"
)

// The migration protocol: JSON lines between the source's vmsup and the
// destination's "vmsup migrate-receive", over the receiver's stdin and
// stdout. The transport (ssh, or nsenter in tests) is what authenticates:
// the receiver listens on nothing and takes commands only from its stdin.
// The source asks, the destination answers, one message at a time:
//
//	hello{version}            -> hello{version, host}
//	prepare{spec, accel, ...} -> prepared{uri} | error   (QEMU -incoming, listening)
//	  ... the source runs "migrate uri" and watches it ...
//	listen                    -> listening | error        (cpr-transfer, local only: after the
//	                                                        source's migrate, the destination's
//	                                                        QEMU has its state and listens now)
//	run                       -> running                  (postcopy only: the guest runs here from now on)
//	finalize{console}         -> finalized | error        (destination running)
//	commit                    -> committed                (local only: sockets handed over)
//	abort (or EOF)            -> the destination tears down what it set up, unless finalized
//
// or, instead of prepare, from a source settling a migration its vmsup
// did not finish (supervisor recovery):
//
//	query{name}               -> state{state}             (after settling this host's side)
//
// or, instead of prepare, a move of a shut-off VM (vmsup move): no QEMU on
// either side, the disks copied over the same NBD relay, then the VM
// defined here:
//
//	move{spec, disks, ...}    -> prepared{disks, nbd} | error  (the copies made and exported)
//	  ... the source copies each disk into its export ...
//	finalize                  -> finalized | error        (the VM is defined here, shut off)
//	abort (or EOF)            -> the copies and everything else made here are removed
//
// A change that an older peer would misread bumps Version; peers
// refuse a version they do not speak.
const Version = 2 // 2: the cross-host stream is TLS (CertPin)

// Message types.
const (
	MsgHello     = "hello"
	MsgPrepare   = "prepare"
	MsgPrepared  = "prepared"
	MsgFinalize  = "finalize"
	MsgFinalized = "finalized"
	MsgCommit    = "commit"
	MsgCommitted = "committed"
	MsgRun       = "run"    // postcopy started: run the guest here now
	MsgListen    = "listen" // cpr-transfer: the source sent its state, listen for the stream
	MsgListening = "listening"
	MsgRunning   = "running"
	MsgAbort     = "abort"
	MsgQuery     = "query" // does the guest run here?
	MsgMove      = "move"  // a shut-off VM's disks and record (an older receiver refuses it)
	MsgState     = "state"
	MsgError     = "error"
)

// States a query answers.
const (
	StateRunning = "running" // the guest runs here
	StateAbsent  = "absent"  // it does not (no QEMU, or one that never took over)
	StateDefined = "defined" // the VM is here, shut off (a move finished here)
)

// Msg is every protocol message; Type says which fields matter.
type Msg struct {
	Type    string `json:"type"`
	Version int    `json:"version,omitempty"`
	Host    string `json:"host,omitempty"`
	Error   string `json:"error,omitempty"`

	// prepare
	Name       string     `json:"name,omitempty"`
	SourceFile string     `json:"source_file,omitempty"` // relative paths in Spec resolve against it
	Spec       []byte     `json:"spec,omitempty"`        // spec.toml as applied on the source
	Accel      spec.Accel `json:"accel,omitempty"`       // the source's resolved accelerator
	// CPUModel and CPUMasks: the source's -cpu choice (host probe), which
	// the destination runs with too (absent from older sources).
	CPUModel string   `json:"cpu_model,omitempty"`
	CPUMasks []string `json:"cpu_masks,omitempty"`
	// Machine: the versioned machine type the source runs, which the
	// destination runs too (absent from older sources).
	Machine string `json:"machine,omitempty"`
	// UUID and GenID: the VM's identity, which the destination's QEMU
	// must present unchanged (absent from older sources).
	UUID     string `json:"uuid,omitempty"`
	GenID    string `json:"genid,omitempty"`
	Listen   string `json:"listen,omitempty"` // address the destination QEMU listens on
	Multifd  int    `json:"multifd,omitempty"`
	Postcopy bool   `json:"postcopy,omitempty"`
	// Markers maps each disk file to a file the source created beside it: the
	// destination seeing it proves the directory is shared.
	Markers map[string]string `json:"markers,omitempty"`
	Local   bool              `json:"local,omitempty"` // in-process, same host
	// RAMID is the name of the source's RAM block (qemuargs.RAM), which
	// the destination's must match (absent from older sources).
	RAMID string `json:"ram_id,omitempty"`
	// CPR: a local destination takes the guest's RAM over in place
	// (cpr-transfer): it starts with a cpr channel and listens for the
	// stream only when asked (listen), after the source's migrate.
	CPR  bool   `json:"cpr,omitempty"`
	From string `json:"from,omitempty"`
	// Timeout is the source's bound on the migration: the destination
	// gives up waiting for finalize a little after it.
	Timeout time.Duration `json:"timeout,omitempty"`

	// Autostart: the VM is enabled for boot on the source; the destination
	// enables it once it runs there (cross-host).
	Autostart bool `json:"autostart,omitempty"`

	// UEFIVars is the VM's OVMF variable store (uefi firmware, cross-host).
	UEFIVars []byte `json:"uefi_vars,omitempty"`

	// Disks (prepare): the source's local file disks a destination that
	// does not see them (its marker) creates and takes a copy of;
	// (prepared) those it made, with their exports.
	Disks []DiskCopy `json:"disks,omitempty"`
	// NBD (prepared): where the destination's relay to its QEMU's NBD
	// server listens ("tcp:HOST:PORT"; the token and certificate are the
	// stream's).
	NBD string `json:"nbd,omitempty"`

	// prepared: where the destination's relay listens, and the token each
	// stream connection must start with.
	URI   string `json:"uri,omitempty"`
	Token string `json:"token,omitempty"`
	// CertPin is the SHA-256 of the relay's TLS certificate (migtls.go).
	CertPin string `json:"cert_pin,omitempty"`
	// CPRSocket: a cpr-transfer destination's cpr channel, where its QEMU
	// waits for the source's state (local only).
	CPRSocket string `json:"cpr_socket,omitempty"`

	// finalize: the source's console log, continued by the destination.
	Console []byte `json:"console,omitempty"`

	// finalized: when the destination's guest resumed (its QEMU's
	// RESUME event), zero if not seen.
	Resumed time.Time `json:"resumed,omitempty"`

	// state: the answer to a query.
	State string `json:"state,omitempty"`
}

// DiskCopy is one disk copied to the destination (storage.go).
type DiskCopy struct {
	Name   string `json:"name"`   // the disk's name in the spec
	File   string `json:"file"`   // its image
	Format string `json:"format"` // qcow2 or raw
	Size   int64  `json:"size"`   // virtual size, bytes
	// Image is the stored image (sha256:HEX) the source's image is an
	// overlay on: a destination whose store has it copies the top layer
	// only. Backing/BackingFormat: a backing file named by the spec's
	// backing key, which the destination must have at the same path.
	Image string `json:"image,omitempty"`
	// ImageSource and ImageVerified are where the source's store pulled
	// Image from and how it was verified ("sha256:HEX"): a destination
	// that lacks the image pulls it from there, by digest.
	ImageSource   string `json:"image_source,omitempty"`
	ImageVerified string `json:"image_verified,omitempty"`
	Backing       string `json:"backing,omitempty"`
	BackingFormat string `json:"backing_format,omitempty"`
	// Sync (prepared): "top" (the destination has the backing) or "full".
	Sync   string `json:"sync,omitempty"`
	Export string `json:"export,omitempty"` // NBD export name (prepared)
}

// Peer is one end of the protocol: it writes messages and reads the
// other side's in a goroutine, so every wait has a deadline and EOF is seen
// at once.
type Peer struct {
	w    io.Writer
	wmu  sync.Mutex
	in   chan Msg
	errc chan error // the reason reading stopped (EOF, bad JSON)
}

func NewPeer(r io.Reader, w io.Writer) *Peer {
	p := &Peer{w: w, in: make(chan Msg, 4), errc: make(chan error, 1)}
	go func() {
		br := bufio.NewReaderSize(r, 64<<10)
		dec := json.NewDecoder(br)
		for {
			var m Msg
			if err := dec.Decode(&m); err != nil {
				if errors.Is(err, io.EOF) {
					err = io.EOF
				}
				p.errc <- err
				close(p.in)
				return
			}
			p.in <- m
		}
	}()
	return p
}

func (p *Peer) Send(m Msg) error {
	p.wmu.Lock()
	defer p.wmu.Unlock()
	b, err := json.Marshal(m)
	if err != nil {
		return err
	}
	_, err = p.w.Write(append(b, '\n'))
	return err
}

// ErrPeerGone means the other side closed the stream (it exited, or its
// transport died).
var ErrPeerGone = errors.New("peer closed the connection")

// recv waits for the next message up to d (or ctx).
func (p *Peer) Recv(ctx context.Context, d time.Duration) (Msg, error) {
	t := time.NewTimer(d)
	defer t.Stop()
	select {
	case m, ok := <-p.in:
		if !ok {
			err := <-p.errc
			p.errc <- err
			if errors.Is(err, io.EOF) {
				return Msg{}, ErrPeerGone
			}
			return Msg{}, fmt.Errorf("protocol: %w", err)
		}
		return m, nil
	case <-t.C:
		return Msg{}, fmt.Errorf("no answer within %s", d)
	case <-ctx.Done():
		return Msg{}, ctx.Err()
	}
}

// call sends m and waits for a reply of type want; an "error" reply becomes
// an error.
func (p *Peer) Call(ctx context.Context, m Msg, want string, d time.Duration) (Msg, error) {
	if err := p.Send(m); err != nil {
		return Msg{}, fmt.Errorf("%s: send: %w", m.Type, err)
	}
	r, err := p.Recv(ctx, d)
	if err != nil {
		return r, fmt.Errorf("%s: %w", m.Type, err)
	}
	if r.Type == MsgError {
		return r, &RemoteError{Step: m.Type, Msg: r.Error}
	}
	if r.Type != want {
		return r, fmt.Errorf("%s: unexpected reply %q", m.Type, r.Type)
	}
	return r, nil
}

// RemoteError is a failure the destination reported.
type RemoteError struct{ Step, Msg string }

func (e *RemoteError) Error() string { return "destination: " + e.Step + ": " + e.Msg }

// Caps are the capabilities both sides enable for a migration.
func Caps(multifd int, postcopy, autoConverge bool) []qmp.MigrationCapability {
	caps := []qmp.MigrationCapability{{Capability: "events", State: true}}
	if multifd > 0 {
		caps = append(caps, qmp.MigrationCapability{Capability: "multifd", State: true})
	}
	if postcopy {
		caps = append(caps, qmp.MigrationCapability{Capability: "postcopy-ram", State: true})
	}
	if autoConverge {
		caps = append(caps, qmp.MigrationCapability{Capability: "auto-converge", State: true})
	}
	return caps
}
