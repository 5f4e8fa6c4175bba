package units

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"io/fs"
	"os"
	"path/filepath"
	"strings"

	"github.com/google/renameio/v2"
)

// SocketService is a socket-activated service installed as unit files: a
// NAME.socket listening with Accept=yes and a NAME@.service template of
// which systemd starts one instance per connection, its standard input and
// output the connection. Nothing runs between connections.
type SocketService struct {
	Name        string // e.g. "vmsup-metrics": NAME.socket and NAME@.service
	Description string
	Listen      string   // ListenStream=: "127.0.0.1:9475", "[::1]:9475" or a port
	ExecStart   []string // the per-connection command
	MaxSeconds  int      // RuntimeMaxSec= of one instance: a stuck client cannot keep it
	WantedBy    string   // the target that starts the socket at boot, e.g. "sockets.target"
}

func (s SocketService) files() (socket, service []byte, err error) {
	if s.Name == "" || strings.ContainsAny(s.Name, "/@\n .") || s.Listen == "" || len(s.ExecStart) == 0 || s.WantedBy == "" {
		return nil, nil, fmt.Errorf("socket service %q: needs a plain name, an address, a command and a target", s.Name)
	}
	var cmd []string
	for _, a := range s.ExecStart {
		q, err := execArg(a)
		if err != nil {
			return nil, nil, fmt.Errorf("socket service %s: %w", s.Name, err)
		}
		cmd = append(cmd, q)
	}
	var w bytes.Buffer
	fmt.Fprintf(&w, "# Written by vmsup; edits are overwritten.\n[Unit]\nDescription=%s\n\n", oneLine(s.Description))
	fmt.Fprintf(&w, "[Socket]\nListenStream=%s\nAccept=yes\nMaxConnections=16\n\n[Install]\nWantedBy=%s\n", oneLine(s.Listen), s.WantedBy)
	socket = bytes.Clone(w.Bytes())
	w.Reset()
	fmt.Fprintf(&w, "# Written by vmsup; edits are overwritten.\n[Unit]\nDescription=%s (one connection)\n\n", oneLine(s.Description))
	fmt.Fprintf(&w, "[Service]\nExecStart=%s\nStandardInput=socket\nStandardOutput=socket\nStandardError=journal\n", strings.Join(cmd, " "))
	if s.MaxSeconds > 0 {
		fmt.Fprintf(&w, "RuntimeMaxSec=%d\n", s.MaxSeconds)
	}
	return socket, w.Bytes(), nil
}

// SocketUnit and ServiceUnit are the unit names.
func (s SocketService) SocketUnit() string  { return s.Name + ".socket" }
func (s SocketService) ServiceUnit() string { return s.Name + "@.service" }

// ErrInstalled is Install's refusal to overwrite an installed service.
var ErrInstalled = errors.New("already installed")

// Install writes the two unit files into dir and enables the socket (a
// link in dir/WantedBy.wants/). It refuses when the socket unit is there
// already: a second install would silently change the first one's address.
func (s SocketService) Install(dir string) error {
	socket, service, err := s.files()
	if err != nil {
		return err
	}
	sp := filepath.Join(dir, s.SocketUnit())
	if _, err := os.Stat(sp); err == nil {
		return fmt.Errorf("%s: %w", sp, ErrInstalled)
	}
	if err := os.MkdirAll(filepath.Join(dir, s.WantedBy+".wants"), 0o755); err != nil {
		return err
	}
	if err := renameio.WriteFile(filepath.Join(dir, s.ServiceUnit()), service, 0o644); err != nil {
		return err
	}
	if err := renameio.WriteFile(sp, socket, 0o644); err != nil {
		return err
	}
	return renameio.Symlink(sp, filepath.Join(dir, s.WantedBy+".wants", s.SocketUnit()))
}

// Uninstall removes what Install wrote; it reports whether there was any.
func (s SocketService) Uninstall(dir string) (bool, error) {
	found := false
	for _, p := range []string{filepath.Join(dir, s.WantedBy+".wants", s.SocketUnit()), filepath.Join(dir, s.SocketUnit()), filepath.Join(dir, s.ServiceUnit())} {
		switch err := os.Remove(p); {
		case err == nil:
			found = true
		case !errors.Is(err, fs.ErrNotExist):
			return found, err
		}
	}
	return found, nil
}

// StartUnit starts an installed unit and waits for the job; a unit that
// failed at once (a socket whose address is taken) is an error naming why.
func (m *Manager) StartUnit(ctx context.Context, name string) error {
	ch := make(chan string, 1)
	if _, err := m.conn.StartUnitContext(ctx, name, "replace", ch); err != nil {
		return fmt.Errorf("unit %s: start: %w", name, err)
	}
	if err := waitJob(ctx, name, "start", ch); err != nil {
		return err
	}
	st, err := m.Status(ctx, name)
	if err != nil {
		return err
	}
	if st.ActiveState != "active" {
		return fmt.Errorf("unit %s: %s/%s (result %s)", name, st.ActiveState, st.SubState, st.Result)
	}
	return nil
}
