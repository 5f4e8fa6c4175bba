package migwire

import (
	"context"
	"io"
	"net"
	"os"
	"time"
)

// Options configure a migration (supervisor.Migrate). Zero values have
// documented defaults.
type Options struct {
	// To is the destination host (the ssh host, and by default the address
	// its QEMU listens on). Ignored with Local.
	To    string
	Local bool
	// Transport is the command that runs "vmsup migrate-receive" on the
	// destination with the protocol on its stdin/stdout. Default: ssh -o
	// BatchMode=yes TO vmsup migrate-receive.
	Transport []string
	// Address is where the destination QEMU listens for the stream;
	// default To.
	Address string
	// Bandwidth in bytes per second; 0 = QEMU 7.2's default, 128 MiB/s
	// (for copied disks: unbounded).
	Bandwidth int64
	// KeepSourceDisks keeps this host's images of the disks copied to the
	// destination once the guest runs there (default: removed).
	KeepSourceDisks bool
	// Downtime is the longest pause allowed for the final copy; 0 = 300 ms.
	Downtime time.Duration
	// Multifd, when > 0, streams RAM over that many connections.
	Multifd      int
	AutoConverge bool
	// NoCPR makes a local migration copy the guest's RAM even where the
	// new QEMU could take it over in place (cpr-transfer).
	NoCPR bool
	// Postcopy switches to postcopy when precopy has not completed after
	// PostcopyAfter (default 10 s): the destination runs the guest at once
	// and fetches missing pages on demand. There is no rollback after the
	// switch: if the stream then breaks, both QEMUs are left as they are
	// (the newest state is split between them) and the error says so.
	Postcopy      bool
	PostcopyAfter time.Duration
	// Timeout bounds the migration stream; when it passes, the migration is
	// cancelled (default 10 min).
	Timeout time.Duration
	// StallTimeout cancels a migration whose transferred bytes have not
	// moved for that long, e.g. a dead network (default 30 s).
	StallTimeout time.Duration
	// Progress, when set, is called every ProgressInterval (default 0.5 s).
	Progress         func(Progress)
	ProgressInterval time.Duration
	// Stderr receives the transport's stderr (default os.Stderr).
	Stderr io.Writer
	// Dial opens the stream connections to the destination's relay
	// (default net.Dialer; tests dial from inside a network namespace).
	Dial func(ctx context.Context, network, address string) (net.Conn, error)
}

// Result reports a completed migration.
type Result struct {
	VM          string        `json:"name"`
	To          string        `json:"to"`
	Unit        string        `json:"unit"` // the unit now running it (local)
	Postcopy    bool          `json:"postcopy"`
	TotalTime   time.Duration `json:"total_time_ns"` // QEMU's total-time
	Downtime    time.Duration `json:"downtime_ns"`   // QEMU's downtime
	SetupTime   time.Duration `json:"setup_time_ns"`
	Transferred int64         `json:"transferred_bytes"`
	// Handover is from vmsup seeing "completed" to the destination
	// reporting the guest running (finalize): the guest stays paused
	// meanwhile, on top of QEMU's Downtime, because the destination runs
	// with -S until vmsup says so.
	Handover time.Duration `json:"handover_ns"`
	Wall     time.Duration `json:"wall_ns"` // the whole vmsup migrate, prepare to handover
	// StopAndCopy: the guest's vCPUs were stopped for the whole copy (a TCG
	// guest: QEMU 7.2's TCG loses writes racing a live copy), so it was paused for about TotalTime, not
	// only Downtime.
	StopAndCopy bool `json:"stop_and_copy"`
	// Mode is how the guest moved: ModeNormal (its RAM copied) or
	// ModeCPRTransfer (one host: the new QEMU took the RAM in place).
	Mode string `json:"mode"`
	// ModeNote says why a local migration copied the RAM ("" otherwise).
	ModeNote string `json:"mode_note,omitempty"`
	// Disks is how many local disks were copied to the destination, and
	// DiskTransferred the bytes their copy jobs sent (sync top: the top
	// layer only).
	Disks           int   `json:"disks,omitempty"`
	DiskTransferred int64 `json:"disk_transferred_bytes,omitempty"`
	// DiskTime is how long the disks took to reach sync, before the RAM.
	DiskTime time.Duration `json:"disk_time_ns,omitempty"`
	// Pause is how long the guest did not run, one host: from the source
	// QEMU's STOP event to the destination's RESUME (QEMU's clocks, the
	// same host's); 0 when not known (across hosts).
	Pause time.Duration `json:"pause_ns,omitempty"`
	// Note says what a move (vmsup move) could not clean up on the
	// source ("" when all went).
	Note string `json:"note,omitempty"`
}

// Migration modes (Result.Mode).
const (
	ModeNormal      = "normal"
	ModeCPRTransfer = "cpr-transfer"
)

// WithDefaults fills the zero fields with their defaults.
func (o Options) WithDefaults() Options {
	if o.Address == "" {
		o.Address = o.To
	}
	if len(o.Transport) == 0 && !o.Local {
		o.Transport = []string{"ssh", "-o", "BatchMode=yes", o.To, "vmsup", "migrate-receive"}
	}
	if o.Timeout <= 0 {
		o.Timeout = 10 * time.Minute
	}
	if o.StallTimeout <= 0 {
		o.StallTimeout = 30 * time.Second
	}
	if o.PostcopyAfter <= 0 {
		o.PostcopyAfter = 10 * time.Second
	}
	if o.ProgressInterval <= 0 {
		o.ProgressInterval = 500 * time.Millisecond
	}
	if o.Stderr == nil {
		o.Stderr = os.Stderr
	}
	if o.Dial == nil {
		o.Dial = DefaultDial
	}
	return o
}
