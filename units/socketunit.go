package units

import (
	"bytes"
	"cmp"
	"context"
	"errors"
	"fmt"
	"io/fs"
	"os"
	"path/filepath"
	"strings"

	"github.com/google/renameio/v2"
	"github.com/vmsup/vmsup/internal/util/atomicfile"
)

// SocketService is a socket-activated service installed as unit files: a
// NAME.socket listening with Accept=yes and a NAME@.service template of
// which systemd starts one instance per connection, its standard input and
// output the connection. Nothing runs between connections.
//
// A burst of connections never stops the socket: systemd 252 puts an
// Accept=yes socket into "failed (trigger-limit-hit)" after 200
// connections within 2 s (its default TriggerLimitBurst=), and a failed
// socket answers nothing until someone resets it. The trigger limit is off
// (TriggerLimitIntervalSec=0); MaxConnections and MaxPerSource bound what
// runs at once instead (a connection over either is closed at once), and
// the service's command must give up on an idle client quickly.
type SocketService struct {
	Name        string // e.g. "vmsup-metrics": NAME.socket and NAME@.service
	Description string
	// Listen is ListenStream=: "127.0.0.1:9475", "[::1]:9475", a port, or
	// an absolute path for a unix socket (made SocketMode).
	Listen     string
	ExecStart  []string // the per-connection command
	MaxSeconds int      // RuntimeMaxSec= of one instance: a stuck client cannot keep it
	WantedBy   string   // the target that starts the socket at boot, e.g. "sockets.target"
	// MaxConnections bounds the instances at once (0: 64);
	// MaxPerSource those of one source address, or of one user on a unix
	// socket (0: 8).
	MaxConnections, MaxPerSource int
	SocketMode                   uint32 // a unix socket's mode (0: 0600)
	// Requires are units each instance needs, ordered before it (the
	// socket of a service it asks in turn).
	Requires []string
	// Sandbox confines each instance (nil: none, root).
	Sandbox *Sandbox
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
	sandbox := ""
	if s.Sandbox != nil {
		if sandbox, err = s.Sandbox.directives(s.ServiceUnit()); err != nil {
			return nil, nil, err
		}
	}
	var w bytes.Buffer
	fmt.Fprintf(&w, "# Written by vmsup; edits are overwritten.\n[Unit]\nDescription=%s\n\n", oneLine(s.Description))
	fmt.Fprintf(&w, "[Socket]\nListenStream=%s\nAccept=yes\n", oneLine(s.Listen))
	if strings.HasPrefix(s.Listen, "/") {
		fmt.Fprintf(&w, "SocketMode=%04o\n", cmp.Or(s.SocketMode, 0o600))
	}
	fmt.Fprintf(&w, "MaxConnections=%d\nMaxConnectionsPerSource=%d\n", cmp.Or(s.MaxConnections, 64), cmp.Or(s.MaxPerSource, 8))
	w.WriteString("# No trigger limit: a burst of connections must never fail the socket for good.\nTriggerLimitIntervalSec=0\n")
	fmt.Fprintf(&w, "\n[Install]\nWantedBy=%s\n", s.WantedBy)
	socket = bytes.Clone(w.Bytes())
	w.Reset()
	fmt.Fprintf(&w, "# Written by vmsup; edits are overwritten.\n[Unit]\nDescription=%s (one connection)\n", oneLine(s.Description))
	if len(s.Requires) > 0 {
		fmt.Fprintf(&w, "Requires=%s\nAfter=%s\n", strings.Join(s.Requires, " "), strings.Join(s.Requires, " "))
	}
	fmt.Fprintf(&w, "\n[Service]\nExecStart=%s\nStandardInput=socket\nStandardOutput=socket\nStandardError=journal\n", strings.Join(cmd, " "))
	// An instance that failed (a client that went away) is not kept.
	w.WriteString("CollectMode=inactive-or-failed\nUMask=0077\n")
	if s.MaxSeconds > 0 {
		fmt.Fprintf(&w, "RuntimeMaxSec=%d\n", s.MaxSeconds)
	}
	w.WriteString(sandbox)
	return socket, w.Bytes(), nil
}

// SocketUnit and ServiceUnit are the unit names.
// Files are the socket and service unit files Install writes (a package
// ships them as they are).
func (s SocketService) Files() (socket, service []byte, err error) { return s.files() }

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
	if err := atomicfile.WriteFile(filepath.Join(dir, s.ServiceUnit()), service, 0o644); err != nil {
		return err
	}
	if err := atomicfile.WriteFile(sp, socket, 0o644); err != nil {
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
