package units

import (
	"bufio"
	"cmp"
	"context"
	"encoding/json"
	"fmt"
	"os/exec"
	"strconv"
	"strings"
	"time"
)

// LastWords returns the last error line QEMU wrote to the unit's journal
// (journalDir: a journal that is not the host's, read with journalctl -D),
// or where to look.
func LastWords(ctx context.Context, journalDir, unit string) string {
	args := []string{"-u", unit, "-o", "cat", "--no-pager", "-n", "20"}
	if journalDir != "" {
		args = append([]string{"-D", journalDir}, args...)
	}
	hint := "see journalctl -u " + unit
	var last string
	// journald may not have the lines yet when the unit has already failed.
	for range 10 {
		cctx, cancel := context.WithTimeout(ctx, 2*time.Second)
		out, err := exec.CommandContext(cctx, "journalctl", args...).Output()
		cancel()
		if err != nil {
			return hint
		}
		for _, l := range strings.Split(strings.TrimSpace(string(out)), "\n") {
			// QEMU prefixes its errors with its name: "qemu-system-x86_64:"
			// from most of it, "qemu:" from the loaders.
			if strings.Contains(l, "qemu-system") || strings.HasPrefix(l, "qemu:") {
				last = l
			}
		}
		if last != "" {
			return last
		}
		time.Sleep(50 * time.Millisecond)
	}
	return hint
}

// Entry is one journal message of a unit.
type Entry struct {
	Time    time.Time
	Unit    string
	Message string
	Cursor  string // where it is in the journal, for AfterCursor
}

// JournalOptions select what Journal reads.
type JournalOptions struct {
	Dir    string // journalctl -D (a journal that is not the host's)
	Units  []string
	Since  time.Time // zero: from the start
	Follow bool      // keep reading new messages until ctx ends
	// AfterCursor starts after this entry (Entry.Cursor); with Follow and
	// no cursor, only new messages are read.
	AfterCursor string
}

// Journal reads the units' messages (journalctl -o json) and calls fn for
// each, in the journal's order.
func Journal(ctx context.Context, o JournalOptions, fn func(Entry)) error {
	args := []string{"-o", "json", "--no-pager", "--output-fields=MESSAGE,_SYSTEMD_UNIT,UNIT,__REALTIME_TIMESTAMP"}
	if o.Dir != "" {
		args = append(args, "-D", o.Dir)
	}
	for _, u := range o.Units {
		args = append(args, "-u", u)
	}
	if !o.Since.IsZero() {
		args = append(args, "--since", "@"+strconv.FormatInt(o.Since.Unix(), 10))
	}
	switch {
	case o.AfterCursor != "":
		args = append(args, "--after-cursor", o.AfterCursor)
	case o.Follow && o.Since.IsZero():
		args = append(args, "-n", "0")
	}
	if o.Follow {
		args = append(args, "-f")
	}
	cmd := exec.CommandContext(ctx, "journalctl", args...)
	out, err := cmd.StdoutPipe()
	if err != nil {
		return err
	}
	var stderr strings.Builder
	cmd.Stderr = &stderr
	if err := cmd.Start(); err != nil {
		return err
	}
	sc := bufio.NewScanner(out)
	sc.Buffer(make([]byte, 64<<10), 4<<20)
	for sc.Scan() {
		var e struct {
			Message any    `json:"MESSAGE"` // a string, or bytes as a number array
			Unit    string `json:"_SYSTEMD_UNIT"`
			UnitMsg string `json:"UNIT"` // systemd's own messages about the unit
			Time    string `json:"__REALTIME_TIMESTAMP"`
			Cursor  string `json:"__CURSOR"`
		}
		if json.Unmarshal(sc.Bytes(), &e) != nil {
			continue
		}
		us, _ := strconv.ParseInt(e.Time, 10, 64)
		fn(Entry{Time: time.UnixMicro(us), Unit: cmp.Or(e.Unit, e.UnitMsg), Message: message(e.Message), Cursor: e.Cursor})
	}
	err = cmd.Wait()
	if ctx.Err() != nil {
		return nil // follow ended by the caller
	}
	if err != nil {
		return fmt.Errorf("journalctl: %w: %s", err, strings.TrimSpace(stderr.String()))
	}
	return sc.Err()
}

// message is MESSAGE as text: journald gives non-UTF-8 ones as byte arrays.
func message(m any) string {
	switch v := m.(type) {
	case string:
		return v
	case []any:
		b := make([]byte, 0, len(v))
		for _, x := range v {
			if f, ok := x.(float64); ok {
				b = append(b, byte(f))
			}
		}
		return string(b)
	}
	return ""
}
