package enrol

import (
	"context"
	"fmt"
	"os"
	"path/filepath"

	"github.com/google/renameio/v2"

	"github.com/vmsup/vmsup/internal/util/atomicfile"
	"github.com/vmsup/vmsup/remoteapi"
	"github.com/vmsup/vmsup/units"
)

// InstallUnits writes vmsup-api.socket and vmsup-api.service into unitDir,
// enables the socket (a link in sockets.target.wants, as systemctl enable
// makes), makes systemd read them, stops a server still running with the
// units it replaced and (re)starts the socket: the next call is served
// with what was written.
func InstallUnits(ctx context.Context, sd *units.Manager, unitDir string, o remoteapi.UnitOptions) error {
	sock, svc, err := remoteapi.Units(o)
	if err != nil {
		return err
	}
	if err := os.MkdirAll(unitDir, 0o755); err != nil {
		return err
	}
	for name, text := range map[string]string{remoteapi.SocketUnit: sock, remoteapi.ServiceUnit: svc} {
		p := filepath.Join(unitDir, name)
		if err := atomicfile.WriteFile(p, []byte(text), 0o644); err != nil {
			return fmt.Errorf("write %s: %w", p, err)
		}
	}
	wants := filepath.Join(unitDir, "sockets.target.wants")
	if err := os.MkdirAll(wants, 0o755); err != nil {
		return err
	}
	if err := renameio.Symlink(filepath.Join(unitDir, remoteapi.SocketUnit), filepath.Join(wants, remoteapi.SocketUnit)); err != nil {
		return fmt.Errorf("enable %s: %w", remoteapi.SocketUnit, err)
	}
	if err := sd.Reload(ctx); err != nil {
		return err
	}
	if err := sd.Stop(ctx, remoteapi.ServiceUnit); err != nil {
		return err
	}
	ch := make(chan string, 1)
	if _, err := sd.DBus().RestartUnitContext(ctx, remoteapi.SocketUnit, "replace", ch); err != nil {
		return fmt.Errorf("start %s: %w", remoteapi.SocketUnit, err)
	}
	select {
	case res := <-ch:
		if res != "done" {
			return fmt.Errorf("start %s: %s (journalctl -u %s says why)", remoteapi.SocketUnit, res, remoteapi.SocketUnit)
		}
	case <-ctx.Done():
		return ctx.Err()
	}
	return nil
}
