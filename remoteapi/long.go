package remoteapi

import (
	"fmt"
	"path/filepath"
	"strings"
	"sync"
	"time"

	hostpaths "github.com/vmsup/vmsup/internal/host/places"
	"github.com/vmsup/vmsup/supervisor"
)

// Backup and migration: long calls (bounded by stream_timeout) that stream
// their progress as NDJSON items and end with an item holding the result.

// BackupRequest is POST /v1/vms/{name}/backup.
type BackupRequest struct {
	// Dir is on the server, in one of its backup_dirs; a relative one is
	// below the first of them.
	Dir         string `json:"dir"`
	Incremental bool   `json:"incremental"`
}

// BackupItem is an item of a backup's stream: progress reports, then the
// result.
type BackupItem struct {
	Progress *supervisor.BackupProgress `json:"progress,omitempty"`
	Result   *supervisor.BackupResult   `json:"result,omitempty"`
}

// MigrateRequest is POST /v1/vms/{name}/migrate: supervisor.MigrateOptions
// without the transport command (the server's default, ssh, only).
type MigrateRequest struct {
	To            string        `json:"to"`
	Local         bool          `json:"local"`
	Address       string        `json:"address"`
	Bandwidth     int64         `json:"bandwidth"`      // bytes per second; 0: QEMU's
	Downtime      time.Duration `json:"downtime"`       // nanoseconds; 0: 300 ms
	Multifd       int           `json:"multifd"`        // parallel connections; 0: one
	AutoConverge  bool          `json:"auto_converge"`  //
	Postcopy      bool          `json:"postcopy"`       //
	PostcopyAfter time.Duration `json:"postcopy_after"` // nanoseconds; 0: 10 s
	Timeout       time.Duration `json:"timeout"`        // nanoseconds; 0: 10 min
	StallTimeout  time.Duration `json:"stall_timeout"`  // nanoseconds; 0: 30 s
	NoCPR         bool          `json:"no_cpr"`         // local: copy the RAM even where cpr-transfer could take it in place
	// KeepSourceDisks keeps this host's images of the disks copied to the
	// destination (storage migration) once the guest runs there.
	KeepSourceDisks bool `json:"keep_source_disks"`
}

// MoveRequest is POST /v1/vms/{name}/move: a shut-off VM to another host
// (vmsup move), supervisor.MigrateOptions' fields that concern it.
type MoveRequest struct {
	To              string        `json:"to"`
	Address         string        `json:"address"`
	Bandwidth       int64         `json:"bandwidth"`     // bytes per second; 0: unbounded
	Timeout         time.Duration `json:"timeout"`       // nanoseconds; 0: 10 min
	StallTimeout    time.Duration `json:"stall_timeout"` // nanoseconds; 0: 30 s
	KeepSourceDisks bool          `json:"keep_source_disks"`
}

// MigrateItem is an item of a migration's stream: progress reports, then
// the result.
type MigrateItem struct {
	Progress *supervisor.MigrationProgress `json:"progress,omitempty"`
	Result   *supervisor.MigrateResult     `json:"result,omitempty"`
}

func (s *Server) longRoutes() []route {
	return []route{
		{Pattern: "POST /v1/vms/{name}/backup", Summary: "backup into a directory of the server's backup_dirs: progress, then the result", Body: BackupRequest{}, Result: BackupItem{}, Stream: true, Long: true, h: s.backup},
		{Pattern: "POST /v1/vms/{name}/migrate", Summary: "migrate (local: operator; to another host: admin): progress, then the result", Body: MigrateRequest{}, Result: MigrateItem{}, Stream: true, Long: true, h: s.migrate},
		{Pattern: "POST /v1/vms/{name}/move", Summary: "move a shut-off VM to another host (admin): progress, then the result", Body: MoveRequest{}, Result: MigrateItem{}, Stream: true, Long: true, h: s.move},
		{Pattern: "POST /v1/vms/{name}/migrate-cancel", Summary: "cancel the VM's migration in progress", h: func(c *call) (any, error) { return vmDo(c, Operator, s.Ops.CancelMigration) }},
	}
}

// backupDirs are the places remote backups may write.
func (s *Server) backupDirs() []string {
	if len(s.Config.BackupDirs) > 0 {
		return s.Config.BackupDirs
	}
	return []string{filepath.Join(s.Root, "backups")}
}

// backupDir is the server's directory for a backup's dir: within one of
// backupDirs (symlinks resolved), a relative one below the first.
func (s *Server) backupDir(dir string) (string, error) {
	places := s.backupDirs()
	if dir == "" {
		return "", newError(KindUsage, "backup: dir is needed")
	}
	if !filepath.IsAbs(dir) {
		dir = filepath.Join(places[0], dir)
	}
	for _, p := range places {
		if ok, err := hostpaths.Within(p, dir); err == nil && ok {
			return dir, nil
		}
	}
	return "", newError(KindUsage, fmt.Sprintf("backup --to %s: outside this server's backup directories (%s: backup_dirs = %s)",
		dir, s.Config.path, strings.Join(places, ", ")))
}

func (s *Server) backup(c *call) (any, error) {
	req, err := decode[BackupRequest](c)
	if err != nil {
		return nil, err
	}
	dir, err := s.backupDir(req.Dir)
	if err != nil {
		return nil, err
	}
	if err := c.allow(Operator, c.name()); err != nil {
		return nil, err
	}
	return nil, streamProgress(c, func(progress func(BackupItem)) (BackupItem, error) {
		res, err := s.Ops.Backup(c.ctx, c.name(), supervisor.BackupOptions{Dir: dir, Incremental: req.Incremental,
			Progress: func(p supervisor.BackupProgress) { progress(BackupItem{Progress: &p}) }})
		return BackupItem{Result: &res}, err
	})
}

func (s *Server) migrate(c *call) (any, error) {
	req, err := decode[MigrateRequest](c)
	if err != nil {
		return nil, err
	}
	if (req.To == "") == !req.Local {
		return nil, newError(KindUsage, "migrate: give exactly one of to and local")
	}
	need := Admin // it names another host, which the stream goes to
	if req.Local {
		need = Operator
	}
	if err := c.allow(need, c.name()); err != nil {
		return nil, err
	}
	return nil, streamProgress(c, func(progress func(MigrateItem)) (MigrateItem, error) {
		res, err := s.Ops.Migrate(c.ctx, c.name(), supervisor.MigrateOptions{To: req.To, Local: req.Local, Address: req.Address,
			Bandwidth: req.Bandwidth, Downtime: req.Downtime, Multifd: req.Multifd, AutoConverge: req.AutoConverge,
			Postcopy: req.Postcopy, PostcopyAfter: req.PostcopyAfter, Timeout: req.Timeout, StallTimeout: req.StallTimeout,
			NoCPR: req.NoCPR, KeepSourceDisks: req.KeepSourceDisks, Progress: func(p supervisor.MigrationProgress) { progress(MigrateItem{Progress: &p}) }})
		return MigrateItem{Result: &res}, err
	})
}

func (s *Server) move(c *call) (any, error) {
	req, err := decode[MoveRequest](c)
	if err != nil {
		return nil, err
	}
	if req.To == "" {
		return nil, newError(KindUsage, "move: give to")
	}
	if err := c.allow(Admin, c.name()); err != nil { // it names another host
		return nil, err
	}
	return nil, streamProgress(c, func(progress func(MigrateItem)) (MigrateItem, error) {
		res, err := s.Ops.Move(c.ctx, c.name(), supervisor.MigrateOptions{To: req.To, Address: req.Address, Bandwidth: req.Bandwidth,
			Timeout: req.Timeout, StallTimeout: req.StallTimeout, KeepSourceDisks: req.KeepSourceDisks,
			Progress: func(p supervisor.MigrationProgress) { progress(MigrateItem{Progress: &p}) }})
		return MigrateItem{Result: &res}, err
	})
}

// streamProgress streams the items run reports through progress (from any
// goroutine, one at a time), then the item it returns, unless it failed.
func streamProgress[I any](c *call, run func(progress func(I)) (I, error)) error {
	return stream(c, func(emit func(I) error) error {
		var mu sync.Mutex
		send := func(it I) error {
			mu.Lock()
			defer mu.Unlock()
			return emit(it)
		}
		last, err := run(func(it I) { send(it) })
		if err != nil {
			return err
		}
		return send(last)
	})
}
