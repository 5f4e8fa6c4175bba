package units_test

import (
	"context"
	"errors"
	"os"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/vmsup/vmsup/units"
)

// fifoReaderEnv makes the test binary a FIFO socket's service (see
// fifoReader).
const fifoReaderEnv = "VMSUP_UNITS_FIFO_READER"

// fifoReader is a FIFO socket's service: it appends what it reads from fd
// 3 to the file named by fifoReaderEnv, one "run" line per start, and ends
// after 300 ms without data.
func fifoReader(out string) {
	// systemd passes it blocking (NonBlocking=no): the poller, and so the
	// deadline, needs it non-blocking.
	syscall.SetNonblock(3, true)
	in := os.NewFile(3, "fifo")
	f, err := os.OpenFile(out, os.O_WRONLY|os.O_APPEND|os.O_CREATE, 0o600)
	if err != nil {
		os.Exit(1)
	}
	f.WriteString("run\n")
	buf := make([]byte, 4096)
	for {
		in.SetReadDeadline(time.Now().Add(300 * time.Millisecond))
		n, err := in.Read(buf)
		f.Write(buf[:n])
		if errors.Is(err, os.ErrDeadlineExceeded) {
			os.Exit(0)
		}
		if err != nil {
			os.Exit(2)
		}
	}
}

// fifoFiles are a test's FIFO path, its reader's output and the reader
// (this test binary).
func fifoFiles(t *testing.T) (fifo, out, self string) {
	t.Helper()
	dir := t.TempDir()
	self, err := os.Executable()
	if err != nil {
		t.Fatal(err)
	}
	return filepath.Join(dir, "w.fifo"), filepath.Join(dir, "out"), self
}

// TestFIFOSocket: a unit writes to a FIFO its socket holds; the service
// runs only while there is data (twice here: two bursts 3 s apart), gets
// every byte, and the socket and its FIFO go when the unit stops.
func TestFIFOSocket(t *testing.T) {
	m, ctx := connect(t)
	fifo, out, self := fifoFiles(t)
	w := units.Unit{Name: "fifo-writer.service", Collect: true,
		Argv: []string{"/bin/sh", "-c", "echo one >" + fifo + "; sleep 3; echo two >" + fifo + "; sleep 60"},
		FIFOSockets: []units.FIFOSocket{{Name: "fifo-reader.socket", Path: fifo, Mode: 0o600,
			Service: units.Unit{Name: "fifo-reader.service", Collect: true, Argv: []string{self},
				Environment: []string{fifoReaderEnv + "=" + out}}}}}
	if err := m.Start(ctx, w); err != nil {
		t.Fatal(err)
	}
	deadline := time.Now().Add(10 * time.Second)
	for b, _ := os.ReadFile(out); string(b) != "run\none\nrun\ntwo\n"; b, _ = os.ReadFile(out) {
		if time.Now().After(deadline) {
			t.Fatalf("the reader wrote %q, want two runs, one line each", b)
		}
		time.Sleep(50 * time.Millisecond)
	}
	waitState(t, m, ctx, "fifo-reader.service", "gone")
	if st := waitState(t, m, ctx, "fifo-reader.socket", "active"); st.SubState != "listening" {
		t.Errorf("socket between bursts: %+v", st)
	}
	if err := m.Stop(ctx, w.Name); err != nil {
		t.Fatal(err)
	}
	drain(t, m, ctx, "fifo-reader.socket", fifo)
	waitState(t, m, ctx, "fifo-reader.socket", "gone")
	if _, err := os.Lstat(fifo); !errors.Is(err, os.ErrNotExist) {
		t.Errorf("the FIFO after its unit stopped: %v", err)
	}
	if b, _ := os.ReadFile(out); strings.Count(string(b), "run") != 2 {
		t.Errorf("reader output %q", b)
	}
}

// TestFIFOSocketLastWords: a unit quiet long enough for the reader to
// have ended writes one line and exits at once: the line still reaches
// the reader, before DrainFIFO stops the socket.
func TestFIFOSocketLastWords(t *testing.T) {
	m, ctx := connect(t)
	fifo, out, self := fifoFiles(t)
	for i := range 5 {
		os.Remove(out)
		w := units.Unit{Name: "fifo-last.service", Collect: true,
			Argv: []string{"/bin/sh", "-c", "sleep 0.5; echo last >" + fifo},
			FIFOSockets: []units.FIFOSocket{{Name: "fifo-last-r.socket", Path: fifo, Mode: 0o600,
				Service: units.Unit{Name: "fifo-last-r.service", Collect: true, Argv: []string{self},
					Environment: []string{fifoReaderEnv + "=" + out}}}}}
		if err := m.Start(ctx, w); err != nil {
			t.Fatal(err)
		}
		waitState(t, m, ctx, "fifo-last.service", "gone")
		drain(t, m, ctx, "fifo-last-r.socket", fifo)
		waitState(t, m, ctx, "fifo-last-r.socket", "gone")
		waitState(t, m, ctx, "fifo-last-r.service", "gone")
		if b, _ := os.ReadFile(out); string(b) != "run\nlast\n" {
			t.Errorf("round %d: the reader wrote %q", i, b)
		}
	}
}

func drain(t *testing.T, m *units.Manager, ctx context.Context, socket, fifo string) {
	t.Helper()
	if err := units.DrainFIFO(ctx, fifo); err != nil {
		t.Fatal(err)
	}
	if err := m.Stop(ctx, socket); err != nil {
		t.Fatal(err)
	}
	os.Remove(fifo)
}
