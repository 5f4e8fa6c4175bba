package remoteapi

import (
	"context"
	"net"
	"time"

	"github.com/vmsup/vmsup/spec"
	"github.com/vmsup/vmsup/supervisor"
)

// Ops are the operations the API serves: the methods of
// *supervisor.Supervisor the CLI's remote-capable commands call. The server
// calls them on the host's supervisor; the client implements them over the
// wire, so a command runs the same code in-process and remotely.
type Ops interface {
	List(ctx context.Context) ([]supervisor.Status, error)
	Names() ([]string, error)
	Status(ctx context.Context, name string) (supervisor.Status, error)
	UpWith(ctx context.Context, o supervisor.UpOptions, files ...*spec.File) ([]supervisor.UpResult, error)
	PlanWith(ctx context.Context, f *spec.File, o supervisor.PlanOptions) (supervisor.PlanResult, error)
	Apply(ctx context.Context, f *spec.File, o supervisor.ApplyOptions) (supervisor.ApplyResult, error)
	Restart(ctx context.Context, f *spec.File) (supervisor.UpResult, error)
	RestartWith(ctx context.Context, f *spec.File, o supervisor.RestartOptions) (supervisor.UpResult, error)
	AppliedSpec(name string) (*spec.File, error)
	DownWith(ctx context.Context, name string, o supervisor.DownOptions) (supervisor.DownResult, error)
	Kill(ctx context.Context, name string) (supervisor.DownResult, error)
	Reboot(ctx context.Context, name string, mode supervisor.RebootMode) (supervisor.RebootResult, error)
	Reset(ctx context.Context, name string) error
	Pause(ctx context.Context, name string) error
	Resume(ctx context.Context, name string) error
	Stats(ctx context.Context, names ...string) ([]supervisor.VMStats, []supervisor.StatsSkipped, error)
	FollowEvents(ctx context.Context, names []string, since time.Time, follow bool, emit func(supervisor.Event) error) error
	Logs(ctx context.Context, name string, o supervisor.LogOptions, fn func(supervisor.LogLine)) error
	Snapshot(ctx context.Context, name, tag string, o supervisor.SnapshotOptions) (supervisor.SnapshotResult, error)
	SnapshotTree(name string) (*supervisor.SnapshotTree, error)
	RemoveSnapshot(ctx context.Context, name, tag string, progress func(disk string, done, total int64)) error
	RevertSnapshot(ctx context.Context, name, tag string, force bool) (supervisor.RevertResult, error)
	Exec(ctx context.Context, name string, argv []string, timeout time.Duration) (supervisor.ExecResult, error)
	// DialConsole and DialVNC connect to the VM's serial console and VNC
	// server; VNCTicket makes a one-time VNC password (display.password).
	DialConsole(ctx context.Context, name string) (net.Conn, error)
	DialVNC(ctx context.Context, name string) (net.Conn, error)
	VNCTicket(ctx context.Context, name string, ttl time.Duration) (string, error)
	Backup(ctx context.Context, name string, o supervisor.BackupOptions) (supervisor.BackupResult, error)
	Migrate(ctx context.Context, name string, o supervisor.MigrateOptions) (supervisor.MigrateResult, error)
	CancelMigration(ctx context.Context, name string) error
	Move(ctx context.Context, name string, o supervisor.MigrateOptions) (supervisor.MigrateResult, error)
}

// The host's supervisor is what the server calls.
var _ Ops = (*supervisor.Supervisor)(nil)

// ctxT shortens handler signatures.
type ctxT = context.Context
