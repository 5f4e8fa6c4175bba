package fleet

import (
	"context"
	"io"

	"github.com/vmsup/vmsup/internal/observe/iohealth"
	"github.com/vmsup/vmsup/spec"
	"github.com/vmsup/vmsup/supervisor"
)

// Supervisor is what the fleet asks of a host's vmsup: the calls an agent
// makes to run, move, stop and watch the VMs placed on its host. A
// *supervisor.Supervisor is one; tests may give another.
type Supervisor interface {
	CheckPaths(ctx context.Context, f *spec.File) error
	Status(ctx context.Context, name string) (supervisor.Status, error)
	PlanWith(ctx context.Context, f *spec.File, o supervisor.PlanOptions) (supervisor.PlanResult, error)
	UpWith(ctx context.Context, o supervisor.UpOptions, files ...*spec.File) ([]supervisor.UpResult, error)
	Apply(ctx context.Context, f *spec.File, o supervisor.ApplyOptions) (supervisor.ApplyResult, error)
	Migrate(ctx context.Context, name string, o supervisor.MigrateOptions) (supervisor.MigrateResult, error)
	Move(ctx context.Context, name string, o supervisor.MigrateOptions) (supervisor.MigrateResult, error)
	Receive(ctx context.Context, r io.Reader, w io.Writer) error
	Kill(ctx context.Context, name string) (supervisor.DownResult, error)
	Down(ctx context.Context, name string) (supervisor.DownResult, error)
	RemoveVM(ctx context.Context, name string) (left []string, err error)
	DiskIO(ctx context.Context, name string) (iohealth.Sample, error)
	RecordEvent(name, event, reason string) error
}

var _ Supervisor = (*supervisor.Supervisor)(nil)
