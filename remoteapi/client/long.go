package client

import (
	"context"
	"errors"
	"net/http"

	"github.com/vmsup/vmsup/remoteapi"
	"github.com/vmsup/vmsup/supervisor"
)

// Backup is POST /v1/vms/{name}/backup; o.Dir is on the server (in its
// backup_dirs; a relative one below the first). o.Progress sees the
// server's progress reports.
func (c *Client) Backup(ctx context.Context, name string, o supervisor.BackupOptions) (supervisor.BackupResult, error) {
	var res supervisor.BackupResult
	err := streamed(ctx, c, http.MethodPost, vm(name, "backup"), nil, remoteapi.BackupRequest{Dir: o.Dir, Incremental: o.Incremental},
		func(it remoteapi.BackupItem) error { return keep(o.Progress, it.Progress, &res, it.Result) })
	return res, err
}

// keep gives a progress item to fn (when there is one of both) and keeps
// a result item in res.
func keep[P, R any](fn func(P), p *P, res *R, r *R) error {
	if fn != nil && p != nil {
		fn(*p)
	}
	if r != nil {
		*res = *r
	}
	return nil
}

// Migrate is POST /v1/vms/{name}/migrate. The server's transport runs
// (ssh to o.To); o.Transport, Stderr, Dial and ProgressInterval are this
// side's and not sent: a transport command is refused.
func (c *Client) Migrate(ctx context.Context, name string, o supervisor.MigrateOptions) (supervisor.MigrateResult, error) {
	var res supervisor.MigrateResult
	if len(o.Transport) > 0 {
		return res, errors.New("vmsup --remote: migrate: a transport command runs on the VMs' host, not over --remote")
	}
	req := remoteapi.MigrateRequest{To: o.To, Local: o.Local, Address: o.Address, Bandwidth: o.Bandwidth, Downtime: o.Downtime,
		Multifd: o.Multifd, AutoConverge: o.AutoConverge, Postcopy: o.Postcopy, PostcopyAfter: o.PostcopyAfter,
		Timeout: o.Timeout, StallTimeout: o.StallTimeout, NoCPR: o.NoCPR, KeepSourceDisks: o.KeepSourceDisks}
	err := streamed(ctx, c, http.MethodPost, vm(name, "migrate"), nil, req,
		func(it remoteapi.MigrateItem) error { return keep(o.Progress, it.Progress, &res, it.Result) })
	return res, err
}

// Move is POST /v1/vms/{name}/move (the server's transport, as Migrate).
func (c *Client) Move(ctx context.Context, name string, o supervisor.MigrateOptions) (supervisor.MigrateResult, error) {
	var res supervisor.MigrateResult
	if len(o.Transport) > 0 {
		return res, errors.New("vmsup --remote: move: a transport command runs on the VMs' host, not over --remote")
	}
	req := remoteapi.MoveRequest{To: o.To, Address: o.Address, Bandwidth: o.Bandwidth, Timeout: o.Timeout,
		StallTimeout: o.StallTimeout, KeepSourceDisks: o.KeepSourceDisks}
	err := streamed(ctx, c, http.MethodPost, vm(name, "move"), nil, req,
		func(it remoteapi.MigrateItem) error { return keep(o.Progress, it.Progress, &res, it.Result) })
	return res, err
}

// CancelMigration is POST /v1/vms/{name}/migrate-cancel.
func (c *Client) CancelMigration(ctx context.Context, name string) error {
	return c.call(ctx, http.MethodPost, vm(name, "migrate-cancel"), nil, nil, nil)
}
