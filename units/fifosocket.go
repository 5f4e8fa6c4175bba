package units

import (
	"context"
	"errors"
	"fmt"
	"io/fs"
	"os"
	"strings"
	"syscall"
	"time"

	"golang.org/x/sys/unix"

	sd "github.com/coreos/go-systemd/v22/dbus"
)

// FIFOSocket is a transient socket unit that holds a FIFO for the unit it
// serves (Unit.FIFOSockets) and starts Service only while there is
// something to read: systemd makes the FIFO (SocketMode Mode, owned by
// root) and keeps it open for reading and writing, so a writer's open and
// writes never wait for a reader; when data comes and Service is not
// running, systemd starts it with the FIFO as its fd 3 (LISTEN_FDS=1).
// Service ends by itself when the FIFO stays empty for a while; the data
// written meanwhile waits in the FIFO and starts it again. So nothing runs
// between bursts.
//
// It is created and started in one D-Bus call with the unit it serves,
// which Requires= and is After= it: no writer opens a path that is not yet
// the FIFO. It does not end with that unit: what the unit wrote last may
// still be in the FIFO, with no Service running yet, and a socket that
// stops takes it with it (measured: TestFIFOSocketLastWords). Whoever
// stops the unit stops the socket once the FIFO is empty (DrainFIFO); a
// socket left listening (its unit crashed) costs no process, and still
// starts Service for what is left. systemd leaves the FIFO's path when it
// stops (no RemoveOnStop=): a new socket of the same path is made while an
// old one may still be stopping.
type FIFOSocket struct {
	Name        string // "NAME.socket"
	Description string
	Path        string // the FIFO; its directory must exist
	// Mode is the FIFO's mode. systemd makes it root's: a writer running
	// as another user needs the write bit for others (the directory
	// keeps everyone else out).
	Mode uint32
	// Service is loaded with the socket, and started by it: NAME.service
	// (systemd 252 takes no transient Service=).
	Service Unit
}

// aux is the socket and its service as StartTransientUnit's auxiliary
// units.
func (s FIFOSocket) aux() ([]sd.PropertyCollection, error) {
	if !strings.HasSuffix(s.Name, ".socket") || s.Path == "" {
		return nil, fmt.Errorf("FIFO socket %q: want NAME.socket and a path", s.Name)
	}
	if want := strings.TrimSuffix(s.Name, ".socket") + ".service"; s.Service.Name != want {
		return nil, fmt.Errorf("FIFO socket %s: its service must be %s, not %q", s.Name, want, s.Service.Name)
	}
	svc, err := s.Service.properties()
	if err != nil {
		return nil, err
	}
	type listen struct{ Type, Path string }
	sock := []sd.Property{
		sd.PropDescription(s.Description),
		prop("Listen", []listen{{"FIFO", s.Path}}),
		prop("SocketMode", s.Mode),
		// Not the default 20 starts in 2 s: a service that ends at once
		// each time (its log's directory gone) must not fail the socket,
		// which would leave the writer blocked on a full FIFO.
		prop("TriggerLimitIntervalUSec", uint64(0)),
		prop("CollectMode", "inactive-or-failed"),
	}
	// The service first: the socket finds it by name when it loads.
	return []sd.PropertyCollection{{Name: s.Service.Name, Properties: svc}, {Name: s.Name, Properties: sock}}, nil
}

// drainWait bounds how long DrainFIFO waits for the FIFO's service.
const drainWait = 5 * time.Second

// DrainFIFO waits until the FIFO at path, held by a FIFOSocket, is empty
// (its service started and read what was left), for at most drainWait;
// nothing there: nothing to wait for. The socket may be stopped then.
func DrainFIFO(ctx context.Context, path string) error {
	f, err := os.OpenFile(path, os.O_RDONLY|syscall.O_NONBLOCK|syscall.O_NOFOLLOW, 0)
	if errors.Is(err, fs.ErrNotExist) {
		return nil
	} else if err != nil {
		return err
	}
	defer f.Close()
	if fi, err := f.Stat(); err != nil || fi.Mode().Type() != fs.ModeNamedPipe {
		return err
	}
	for deadline := time.Now().Add(drainWait); ; time.Sleep(5 * time.Millisecond) {
		n, err := unix.IoctlGetInt(int(f.Fd()), unix.TIOCINQ) // FIONREAD
		switch {
		case err != nil:
			return fmt.Errorf("%s: %w", path, err)
		case n == 0:
			return nil
		case ctx.Err() != nil:
			return ctx.Err()
		case time.Now().After(deadline):
			return fmt.Errorf("%s: %d bytes still unread after %s", path, n, drainWait)
		}
	}
}

// socketDeps are the properties that make u need its sockets.
func (u Unit) socketDeps() []sd.Property {
	if len(u.FIFOSockets) == 0 {
		return nil
	}
	var names []string
	for _, s := range u.FIFOSockets {
		names = append(names, s.Name)
	}
	return []sd.Property{prop("Requires", names), sd.PropAfter(names...)}
}

// auxUnits are u's sockets and their services.
func (u Unit) auxUnits() ([]sd.PropertyCollection, error) {
	var out []sd.PropertyCollection
	for _, s := range u.FIFOSockets {
		a, err := s.aux()
		if err != nil {
			return nil, fmt.Errorf("unit %s: %w", u.Name, err)
		}
		out = append(out, a...)
	}
	return out, nil
}
