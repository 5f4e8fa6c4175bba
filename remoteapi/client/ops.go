package client

import (
	"context"
	"net/http"
	"net/url"
	"time"

	"github.com/vmsup/vmsup/remoteapi"
	"github.com/vmsup/vmsup/spec"
	"github.com/vmsup/vmsup/supervisor"
)

// A Client is the operations the CLI calls.
var _ remoteapi.Ops = (*Client)(nil)

const v = "/" + remoteapi.Version

// List is GET /v1/vms.
func (c *Client) List(ctx context.Context) ([]supervisor.Status, error) {
	var out []supervisor.Status
	return out, c.call(ctx, http.MethodGet, v+"/vms", nil, nil, &out)
}

// Names is GET /v1/names.
func (c *Client) Names() ([]string, error) {
	var out []string
	return out, c.call(context.Background(), http.MethodGet, v+"/names", nil, nil, &out)
}

// Status is GET /v1/vms/{name}.
func (c *Client) Status(ctx context.Context, name string) (supervisor.Status, error) {
	var out supervisor.Status
	return out, c.call(ctx, http.MethodGet, vm(name), nil, nil, &out)
}

// UpWith is POST /v1/up with the files' contents.
func (c *Client) UpWith(ctx context.Context, o supervisor.UpOptions, files ...*spec.File) ([]supervisor.UpResult, error) {
	req := remoteapi.UpRequest{Adopt: o.Adopt, Files: []remoteapi.File{}}
	for _, f := range files {
		req.Files = append(req.Files, file(f))
	}
	var out []supervisor.UpResult
	return out, c.call(ctx, http.MethodPost, v+"/up", nil, req, &out)
}

// PlanWith is POST /v1/plan.
func (c *Client) PlanWith(ctx context.Context, f *spec.File, o supervisor.PlanOptions) (supervisor.PlanResult, error) {
	var out supervisor.PlanResult
	return out, c.call(ctx, http.MethodPost, v+"/plan", nil, remoteapi.PlanRequest{File: file(f), Adopt: o.Adopt}, &out)
}

// Apply is POST /v1/apply.
func (c *Client) Apply(ctx context.Context, f *spec.File, o supervisor.ApplyOptions) (supervisor.ApplyResult, error) {
	var out supervisor.ApplyResult
	req := remoteapi.ApplyRequest{File: file(f), Restart: o.Restart, AtNextReboot: o.AtNextReboot, Adopt: o.Adopt}
	return out, c.call(ctx, http.MethodPost, v+"/apply", nil, req, &out)
}

// AppliedSpec is GET /v1/vms/{name}/spec, parsed as the server's file.
func (c *Client) AppliedSpec(name string) (*spec.File, error) {
	var a remoteapi.AppliedSpec
	if err := c.call(context.Background(), http.MethodGet, vm(name, "spec"), nil, nil, &a); err != nil {
		return nil, err
	}
	f, err := spec.Parse(a.Path, []byte(a.Content))
	if err != nil {
		return nil, err
	}
	c.mu.Lock()
	c.applied[f] = true
	c.mu.Unlock()
	return f, nil
}

// Restart is POST /v1/vms/{name}/restart: with f's content, or by name
// for a file AppliedSpec returned.
func (c *Client) Restart(ctx context.Context, f *spec.File) (supervisor.UpResult, error) {
	c.mu.Lock()
	applied := c.applied[f]
	c.mu.Unlock()
	var req remoteapi.RestartRequest
	if !applied {
		sf := file(f)
		req.File = &sf
	}
	var out supervisor.UpResult
	return out, c.call(ctx, http.MethodPost, vm(f.VM.Name, "restart"), nil, req, &out)
}

// RestartWith is Restart (o.Waiting is not called: the server waits).
func (c *Client) RestartWith(ctx context.Context, f *spec.File, _ supervisor.RestartOptions) (supervisor.UpResult, error) {
	return c.Restart(ctx, f)
}

// DownWith is POST /v1/vms/{name}/down (o.Waiting is not called: the
// server waits).
func (c *Client) DownWith(ctx context.Context, name string, o supervisor.DownOptions) (supervisor.DownResult, error) {
	var out supervisor.DownResult
	return out, c.call(ctx, http.MethodPost, vm(name, "down"), nil, remoteapi.DownRequest{Timeout: o.Timeout, Force: o.Force}, &out)
}

// Kill is POST /v1/vms/{name}/kill.
func (c *Client) Kill(ctx context.Context, name string) (supervisor.DownResult, error) {
	var out supervisor.DownResult
	return out, c.call(ctx, http.MethodPost, vm(name, "kill"), nil, nil, &out)
}

// Reboot is POST /v1/vms/{name}/reboot.
func (c *Client) Reboot(ctx context.Context, name string, mode supervisor.RebootMode) (supervisor.RebootResult, error) {
	var out supervisor.RebootResult
	return out, c.call(ctx, http.MethodPost, vm(name, "reboot"), nil, remoteapi.RebootRequest{Mode: mode}, &out)
}

// Reset is POST /v1/vms/{name}/reset.
func (c *Client) Reset(ctx context.Context, name string) error {
	return c.call(ctx, http.MethodPost, vm(name, "reset"), nil, nil, nil)
}

// Pause is POST /v1/vms/{name}/pause.
func (c *Client) Pause(ctx context.Context, name string) error {
	return c.call(ctx, http.MethodPost, vm(name, "pause"), nil, nil, nil)
}

// Resume is POST /v1/vms/{name}/resume.
func (c *Client) Resume(ctx context.Context, name string) error {
	return c.call(ctx, http.MethodPost, vm(name, "resume"), nil, nil, nil)
}

// Stats is GET /v1/stats.
func (c *Client) Stats(ctx context.Context, names ...string) ([]supervisor.VMStats, []supervisor.StatsSkipped, error) {
	var out remoteapi.StatsResult
	err := c.call(ctx, http.MethodGet, v+"/stats", url.Values{"name": names}, nil, &out)
	return out.VMs, out.Skipped, err
}

// since is the query of a streamed read.
func since(t time.Time, follow bool) url.Values {
	q := url.Values{}
	if !t.IsZero() {
		q.Set("since", t.UTC().Format(time.RFC3339Nano))
	}
	if follow {
		q.Set("follow", "true")
	}
	return q
}

// FollowEvents is GET /v1/events, streamed.
func (c *Client) FollowEvents(ctx context.Context, names []string, from time.Time, follow bool, emit func(supervisor.Event) error) error {
	q := since(from, follow)
	q["name"] = names
	return lines(ctx, c, v+"/events", q, emit)
}

// Logs is GET /v1/vms/{name}/logs, streamed.
func (c *Client) Logs(ctx context.Context, name string, o supervisor.LogOptions, fn func(supervisor.LogLine)) error {
	return lines(ctx, c, vm(name, "logs"), since(o.Since, o.Follow), func(l supervisor.LogLine) error { fn(l); return nil })
}

// Snapshot is POST /v1/vms/{name}/snapshots (o.Progress is not called).
func (c *Client) Snapshot(ctx context.Context, name, tag string, o supervisor.SnapshotOptions) (supervisor.SnapshotResult, error) {
	var out supervisor.SnapshotResult
	return out, c.call(ctx, http.MethodPost, vm(name, "snapshots"), nil, remoteapi.SnapshotRequest{Tag: tag, Memory: o.Memory}, &out)
}

// SnapshotTree is GET /v1/vms/{name}/snapshots.
func (c *Client) SnapshotTree(name string) (*supervisor.SnapshotTree, error) {
	var out supervisor.SnapshotTree
	if err := c.call(context.Background(), http.MethodGet, vm(name, "snapshots"), nil, nil, &out); err != nil {
		return nil, err
	}
	return &out, nil
}

// RemoveSnapshot is DELETE /v1/vms/{name}/snapshots/{tag} (progress is
// not called).
func (c *Client) RemoveSnapshot(ctx context.Context, name, tag string, _ func(disk string, done, total int64)) error {
	return c.call(ctx, http.MethodDelete, vm(name, "snapshots", tag), nil, nil, nil)
}

// RevertSnapshot is POST /v1/vms/{name}/snapshots/{tag}/revert.
func (c *Client) RevertSnapshot(ctx context.Context, name, tag string, force bool) (supervisor.RevertResult, error) {
	var out supervisor.RevertResult
	return out, c.call(ctx, http.MethodPost, vm(name, "snapshots", tag, "revert"), nil, remoteapi.RevertRequest{Force: force}, &out)
}

// Exec is POST /v1/vms/{name}/exec.
func (c *Client) Exec(ctx context.Context, name string, argv []string, timeout time.Duration) (supervisor.ExecResult, error) {
	var out supervisor.ExecResult
	return out, c.call(ctx, http.MethodPost, vm(name, "exec"), nil, remoteapi.ExecRequest{Argv: argv, Timeout: timeout}, &out)
}
