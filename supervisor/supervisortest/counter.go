package supervisortest

import (
	"context"
	"fmt"
	"os"
	"regexp"
	"slices"
	"strconv"
	"testing"
	"time"

	"github.com/vmsup/vmsup/internal/dev/testenv"
	"github.com/vmsup/vmsup/spec"
)

// The counter guest prints "VMSUP-COUNTER N" on its console every 0.2 s
// (kernel argument vmsup.counter): a gap or a repeat in the numbers is a
// guest that stopped or ran twice, which is what a migration or a killed
// command must never cause.

// MigrationGuest writes DIR/NAME.toml for a counter guest of the given
// memory with one raw data disk at disk (4 MiB of zeros, made here; shared:
// both "hosts" of TwoHosts see the same /tmp), and parses it.
func MigrationGuest(t testing.TB, e *testenv.Env, dir, name, memory, disk string) *spec.File {
	t.Helper()
	if err := os.WriteFile(disk, make([]byte, 4<<20), 0o600); err != nil {
		t.Fatal(err)
	}
	// The guest's ACPI power-off within 5 s on a quiet host, longer on a
	// loaded one (a down that quits instead fails the tests that want ACPI).
	body := fmt.Sprintf(`name = %q
memory = %q
accel = "tcg"
stop_timeout = "`+testenv.GuestBound(5*time.Second).Round(time.Second).String()+`"

[boot]
kernel = %q
initrd = %q
cmdline = "console=ttyS0 no_timer_check vmsup.counter"

[[disk]]
name = "data"
file = %q
format = "raw"
`, name, memory, e.Guest.Kernel, e.Guest.Initrd, disk)
	return LoadTOML(t, dir, name, body)
}

// GuestExec runs one shell command in the guest over its console socket
// and returns its output; it fails the test unless the command exits 0.
func GuestExec(t testing.TB, ctx context.Context, consoleSock, cmd string) string {
	t.Helper()
	sh, err := testenv.DialConsole(ctx, consoleSock)
	if err != nil {
		t.Fatal(err)
	}
	defer sh.Close()
	rctx, cancel := context.WithTimeout(ctx, testenv.GuestBound(60*time.Second))
	defer cancel()
	out, code, err := sh.Run(rctx, cmd)
	if err != nil || code != 0 {
		t.Fatalf("guest %q: exit %d, %v; output %q", cmd, code, err, Tail(out, 600))
	}
	return out
}

// WriteGuestData writes token at the start of the guest's data disk,
// bypassing nothing: it must reach the image before the migration ends.
func WriteGuestData(t testing.TB, ctx context.Context, consoleSock, token string) {
	t.Helper()
	GuestExec(t, ctx, consoleSock, fmt.Sprintf("printf '%%s' %s | dd of=/dev/vda bs=512 conv=fsync,notrunc 2>/dev/null; sync", token))
}

// ReadGuestData reads n bytes back from the data disk with the page cache
// dropped, so the bytes come from the image as the destination QEMU sees it.
func ReadGuestData(t testing.TB, ctx context.Context, consoleSock string, n int) string {
	t.Helper()
	// The counter prints on the same console: fence the data so a counter
	// line landing next to it cannot be taken for part of it.
	out := GuestExec(t, ctx, consoleSock, fmt.Sprintf("dmesg -n 1; echo 3 > /proc/sys/vm/drop_caches; printf 'DATA[%%s]\\n' \"$(dd if=/dev/vda bs=512 count=1 2>/dev/null | head -c %d)\"", n))
	m := regexp.MustCompile(`DATA\[([^\]]*)\]`).FindStringSubmatch(out)
	if m == nil {
		t.Fatalf("no DATA[...] in %q", out)
	}
	return m[1]
}

// The guest prints each counter value twice ("VMSUP-COUNTER 5 5"). Other
// output on the console (the echo of a command typed there while the
// counter printed) can cut into a line; one whose copies differ, or whose
// first copy is not followed by the second, is Unreadable: a value that was
// printed but cannot be read (a loaded run read "VMSUP-COUNTER 21121" from
// one such line and saw a jump).
var counterRE = regexp.MustCompile(`VMSUP-COUNTER (\d+)( (\d+))?`)

// Unreadable stands for one counter line that other console output cut
// into, in the sequences WaitCounterPast returns and CheckContinuous reads.
const Unreadable = -1

// Counters returns the counter values in the console log, in order.
func Counters(log string) []int {
	b, _ := os.ReadFile(log)
	return CounterValues(string(b))
}

// CounterValues are the readable counter values in console text, in order.
func CounterValues(text string) []int {
	return slices.DeleteFunc(counterSequence(text), func(v int) bool { return v == Unreadable })
}

// counterSequence is every counter line in text, in order: its value, or
// Unreadable.
func counterSequence(text string) []int {
	var out []int
	for _, m := range counterRE.FindAllStringSubmatch(text, -1) {
		n, err := strconv.Atoi(m[1])
		if err != nil || m[3] != m[1] {
			n = Unreadable
		}
		out = append(out, n)
	}
	return out
}

// WaitCounterPast waits until the console log shows a counter value > n
// and returns the sequence (with Unreadable lines, never last); d is the
// bound on a quiet host (testenv.GuestWait).
func WaitCounterPast(t testing.TB, log string, n int, d time.Duration) []int {
	t.Helper()
	w := testenv.StartGuestWait("the counter passes a value", d)
	for {
		b, _ := os.ReadFile(log)
		c := counterSequence(string(b))
		for len(c) > 0 && c[len(c)-1] == Unreadable {
			c = c[:len(c)-1]
		}
		if len(c) > 0 && c[len(c)-1] > n {
			w.Done()
			return c
		}
		if w.Expired() {
			t.Fatalf("%s: counter did not pass %d: %s (last values %v); log tail:\n%s", log, n, w.Explain(), lastN(c, 5), Tail(string(b), 1500))
		}
		time.Sleep(100 * time.Millisecond)
	}
}

// CheckContinuous fails unless the values go up by exactly one each time,
// an Unreadable line standing for exactly one value.
func CheckContinuous(t testing.TB, c []int) {
	t.Helper()
	prev, skipped := Unreadable, 0
	for i, v := range c {
		switch {
		case v == Unreadable:
			skipped++
			continue
		case prev != Unreadable && v != prev+1+skipped:
			t.Fatalf("counter jumps from %d to %d past %d unreadable lines (values around: %v)", prev, v, skipped, c[max(0, i-5):min(len(c), i+5)])
		}
		prev, skipped = v, 0
	}
}

func lastN(c []int, n int) []int {
	if len(c) > n {
		return c[len(c)-n:]
	}
	return c
}

// LastCounter is the last counter value in the console log (-1 if none).
func LastCounter(t testing.TB, log string) int {
	c := Counters(log)
	if len(c) == 0 {
		return -1
	}
	return c[len(c)-1]
}

// waitCounterMoves waits for three more counter lines in the log: the
// guest runs (it is not frozen, and not stopped by a migration). d is the
// bound on a quiet host (testenv.GuestWait).
func waitCounterMoves(t testing.TB, log string, d time.Duration, diag ...func() string) {
	t.Helper()
	n := len(Counters(log))
	w := testenv.StartGuestWait("the counter moves 3 lines", d)
	for len(Counters(log)) < n+3 {
		if w.Expired() {
			b, _ := os.ReadFile(log)
			extra := ""
			for _, f := range diag {
				extra += f()
			}
			t.Fatalf("%s: the guest's counter did not move: %s; log tail:\n%s\nQEMU: %s", log, w.Explain(), Tail(string(b), 800), extra)
		}
		time.Sleep(100 * time.Millisecond)
	}
	w.Done()
}
