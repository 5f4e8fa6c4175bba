package remoteapi_test

import (
	"context"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/vmsup/vmsup/remoteapi"
	"github.com/vmsup/vmsup/supervisor"
)

// Backup and Migrate of blockingOps report progress twice, then a result
// naming what they were given.
func (o *blockingOps) Backup(ctx context.Context, name string, b supervisor.BackupOptions) (supervisor.BackupResult, error) {
	for i := range 2 {
		b.Progress(supervisor.BackupProgress{Done: int64(i), Total: 2})
	}
	return supervisor.BackupResult{VM: name, Dir: b.Dir, Point: 1, Live: b.Incremental}, nil
}

func (o *blockingOps) Migrate(ctx context.Context, name string, m supervisor.MigrateOptions) (supervisor.MigrateResult, error) {
	for i := range 2 {
		m.Progress(supervisor.MigrationProgress{Transferred: int64(i)})
	}
	return supervisor.MigrateResult{VM: name, To: m.To + "|" + m.Address, Postcopy: m.Postcopy}, nil
}

func (o *blockingOps) Move(ctx context.Context, name string, m supervisor.MigrateOptions) (supervisor.MigrateResult, error) {
	m.Progress(supervisor.MigrationProgress{Status: "disks", DiskTransferred: 1, DiskTotal: 2})
	return supervisor.MigrateResult{VM: name, To: m.To + "|" + m.Address, Disks: 1, DiskTransferred: m.Bandwidth}, nil
}

// TestRemoteBackupAndMigrate: a remote backup writes only into the
// server's backup_dirs (a relative dir below the first, an absolute one
// within, a path out of them refused, also through a symlink); progress
// and the result come back; migrating locally needs operator, to another
// host admin, and a transport command is refused.
func TestRemoteBackupAndMigrate(t *testing.T) {
	dirs := t.TempDir()
	first, second := filepath.Join(dirs, "first"), filepath.Join(dirs, "second")
	for _, d := range []string{first, second} {
		if err := os.Mkdir(d, 0o700); err != nil {
			t.Fatal(err)
		}
	}
	if err := os.Symlink("/etc", filepath.Join(second, "etc")); err != nil {
		t.Fatal(err)
	}
	h := startLimits(t, "backup_dirs = [\""+first+"\", \""+second+"\"]\n[[grant]]\nidentity = \"cn:o\"\nrole = \"operator\"\nvms = [\"*\"]")
	if _, _, err := h.pki.Issue("o"); err != nil {
		t.Fatal(err)
	}
	a, o := h.client(t, "a"), h.client(t, "o")
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	for dir, want := range map[string]string{"web": filepath.Join(first, "web"), filepath.Join(second, "db/daily"): filepath.Join(second, "db/daily")} {
		var seen []int64
		res, err := o.Backup(ctx, "quick", supervisor.BackupOptions{Dir: dir, Incremental: true, Progress: func(p supervisor.BackupProgress) { seen = append(seen, p.Done) }})
		if err != nil || res.Dir != want || !res.Live || len(seen) != 2 {
			t.Errorf("backup --to %s: %+v, %v, progress %v; want dir %s and 2 reports", dir, res, err, seen, want)
		}
	}
	for _, dir := range []string{"/tmp/elsewhere", "../escape", filepath.Join(second, "etc", "x")} {
		_, err := a.Backup(ctx, "quick", supervisor.BackupOptions{Dir: dir})
		wantAPIError(t, "backup --to "+dir, err, remoteapi.KindUsage, "outside this server's backup directories", "backup_dirs = "+first+", "+second)
	}
	// Refused before its role was checked, it is still audited with its VM.
	wantAudited(t, h, `"identity":"cn:a"`, "POST /v1/vms/{name}/backup", `"vms":["quick"]`, "/tmp/elsewhere: outside")
	// vmsup's own units are no VM's: refused as unknown, the operation never asked.
	if _, err := a.Status(ctx, "api"); err == nil || !strings.Contains(err.Error(), "remote API server") {
		t.Errorf("status api: %v; want refused as vmsup's own unit", err)
	}
	_, err := a.DownWith(ctx, "api", supervisor.DownOptions{Kill: true})
	wantAPIError(t, "kill api", err, remoteapi.KindNotFound, `vm "api": no such VM: name "api" is reserved`)

	var seen int
	res, err := o.Migrate(ctx, "quick", supervisor.MigrateOptions{Local: true, Postcopy: true, Progress: func(supervisor.MigrationProgress) { seen++ }})
	if err != nil || res.VM != "quick" || !res.Postcopy || seen != 2 {
		t.Errorf("migrate --local as operator: %+v, %v, %d progress reports", res, err, seen)
	}
	_, err = o.Migrate(ctx, "quick", supervisor.MigrateOptions{To: "elsewhere"})
	wantAPIError(t, "migrate --to as operator", err, remoteapi.KindForbidden, "cn:o may not migrate: it needs role admin")
	if res, err := a.Migrate(ctx, "quick", supervisor.MigrateOptions{To: "there", Address: "10.0.0.2"}); err != nil || res.To != "there|10.0.0.2" {
		t.Errorf("migrate --to as admin: %+v, %v", res, err)
	}
	if _, err := a.Migrate(ctx, "quick", supervisor.MigrateOptions{To: "there", Transport: []string{"sh", "-c", "id"}}); err == nil || !strings.Contains(err.Error(), "not over --remote") {
		t.Errorf("migrate with a transport command: %v", err)
	}
	// A move names another host too: admin only.
	_, err = o.Move(ctx, "quick", supervisor.MigrateOptions{To: "elsewhere"})
	wantAPIError(t, "move as operator", err, remoteapi.KindForbidden, "cn:o may not move: it needs role admin")
	seen = 0
	o2 := supervisor.MigrateOptions{To: "there", Address: "10.0.0.2", Bandwidth: 7, Progress: func(supervisor.MigrationProgress) { seen++ }}
	if res, err := a.Move(ctx, "quick", o2); err != nil || res.To != "there|10.0.0.2" || res.DiskTransferred != 7 || seen != 1 {
		t.Errorf("move as admin: %+v, %v, %d progress reports", res, err, seen)
	}
}
