package auditlog

import (
	"bufio"
	"bytes"
	"encoding/json"
	"fmt"
	"os"
	"path/filepath"
	"time"
)

// dropRefusals keeps a full file's refusals to their budget: if they take
// more than half of Max, the oldest are dropped until they take a quarter,
// and the file is written again (beside it, synced, renamed over it) with
// a head counting them among the lost. Called with the lock held.
func (l Log) dropRefusals() error {
	b, err := os.ReadFile(l.Path)
	if err != nil {
		return err
	}
	lines := bytes.Split(bytes.TrimSuffix(b, []byte("\n")), []byte("\n"))
	h, hasHead := head(lines[0])
	if hasHead {
		lines = lines[1:]
	}
	var refused int64
	isRefusal := make([]bool, len(lines))
	for i, line := range lines {
		if isRefusal[i] = l.Refusal(line); isRefusal[i] {
			refused += int64(len(line)) + 1
		}
	}
	if refused <= l.Max/2 {
		return nil
	}
	var kept [][]byte
	var dropped int64
	for i, line := range lines {
		if isRefusal[i] && refused > l.Max/4 {
			refused -= int64(len(line)) + 1
			dropped++
			continue
		}
		kept = append(kept, line)
	}
	now := time.Now
	if l.Now != nil {
		now = l.Now
	}
	h = Head{Time: now().UTC(), Rotated: true, Lost: h.Lost + dropped, Refusals: h.Refusals + dropped}
	h.Note = fmt.Sprintf("%s: %d more refusals suppressed (the oldest, dropped to keep refusals to half of %d bytes; %d in all); %d older entries are lost in all",
		filepath.Base(l.Path), dropped, l.Max, h.Refusals, h.Lost)
	hb, err := json.Marshal(h)
	if err != nil {
		return err
	}
	return replaceFile(l.Path, append([][]byte{hb}, kept...))
}

// replaceFile writes lines to a new file beside path, syncs it and renames
// it over path: a reader sees the old file or the new one, whole.
func replaceFile(path string, lines [][]byte) error {
	f, err := os.CreateTemp(filepath.Dir(path), "."+filepath.Base(path)+".*")
	if err != nil {
		return err
	}
	defer os.Remove(f.Name()) // gone after the rename; left by a failure
	w := bufio.NewWriter(f)
	for _, line := range lines {
		w.Write(line)
		w.WriteByte('\n')
	}
	err = w.Flush()
	if err == nil {
		err = f.Sync()
	}
	if cerr := f.Close(); err == nil {
		err = cerr
	}
	if err != nil {
		return err
	}
	return os.Rename(f.Name(), path)
}
