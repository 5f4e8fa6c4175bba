package consolelog

import (
	"bytes"
	"encoding/binary"
	"io/fs"
	"os"
	"path/filepath"
	"syscall"
	"testing"
)

// pattern fills b with the test stream from its offset off: a big-endian
// counter of 8-byte words, so that any slice of it says where it is from.
func pattern(b []byte, off int64) {
	var w [8]byte
	for i := 0; i < len(b); {
		p := off + int64(i)
		binary.BigEndian.PutUint64(w[:], uint64(p/8))
		i += copy(b[i:], w[p%8:])
	}
}

func patternAt(off, n int64) []byte {
	b := make([]byte, n)
	pattern(b, off)
	return b
}

// readLog returns the log's files' contents, oldest first, checking each
// against the bounds.
func readLog(t *testing.T, c Config) []byte {
	t.Helper()
	var all []byte
	files := Files(c)
	if len(files) > c.Keep {
		t.Fatalf("%d files, Keep is %d", len(files), c.Keep)
	}
	for i, name := range files {
		b, err := os.ReadFile(name)
		if err != nil {
			t.Fatal(err)
		}
		if int64(len(b)) > c.MaxBytes {
			t.Errorf("%s: %d bytes, more than MaxBytes %d", name, len(b), c.MaxBytes)
		}
		if i < len(files)-1 && int64(len(b)) != c.MaxBytes {
			t.Errorf("%s, rotated: %d bytes, not MaxBytes %d", name, len(b), c.MaxBytes)
		}
		all = append(all, b...)
	}
	if int64(len(all)) > int64(c.Keep)*c.MaxBytes {
		t.Errorf("log: %d bytes, more than Keep×MaxBytes %d", len(all), int64(c.Keep)*c.MaxBytes)
	}
	return all
}

func TestValidate(t *testing.T) {
	if err := Default("/x/console.log").Validate(); err != nil {
		t.Errorf("Default: %v", err)
	}
	for _, c := range []Config{
		{MaxBytes: DefaultMaxBytes, Keep: 1},
		{Path: "l", MaxBytes: MinMaxBytes - 1, Keep: 1},
		{Path: "l", MaxBytes: MinMaxBytes, Keep: 0},
	} {
		if c.Validate() == nil {
			t.Errorf("%+v: valid", c)
		}
	}
}

func TestMakeFIFO(t *testing.T) {
	dir := t.TempDir()
	p := filepath.Join(dir, "console.fifo")
	if err := os.WriteFile(p, []byte("old"), 0o644); err != nil {
		t.Fatal(err)
	}
	uid, gid := os.Getuid(), os.Getgid()
	if uid == 0 {
		uid, gid = 65534, 65534 // root can give it away, as vmsup does
	}
	for range 2 { // over a file, then over a FIFO
		if err := MakeFIFO(p, uid, gid); err != nil {
			t.Fatal(err)
		}
		fi, err := os.Lstat(p)
		if err != nil {
			t.Fatal(err)
		}
		st := fi.Sys().(*syscall.Stat_t)
		if fi.Mode().Type() != fs.ModeNamedPipe || fi.Mode().Perm() != 0o600 || int(st.Uid) != uid || int(st.Gid) != gid {
			t.Errorf("FIFO: mode %v, owner %d:%d; want a named pipe 0600 of %d:%d", fi.Mode(), st.Uid, st.Gid, uid, gid)
		}
	}
	if ents, _ := os.ReadDir(dir); len(ents) != 1 {
		t.Errorf("left in the directory: %v", ents)
	}
}

func TestFiles(t *testing.T) {
	c := Config{Path: filepath.Join(t.TempDir(), "console.log"), MaxBytes: MinMaxBytes, Keep: 3}
	if f := Files(c); len(f) != 0 {
		t.Errorf("no log: %v", f)
	}
	for _, n := range []string{c.Path + ".2", c.Path} {
		if err := os.WriteFile(n, nil, 0o600); err != nil {
			t.Fatal(err)
		}
	}
	if err := os.WriteFile(c.Path+".3", nil, 0o600); err != nil { // beyond Keep
		t.Fatal(err)
	}
	if f := Files(c); len(f) != 2 || f[0] != c.Path+".2" || f[1] != c.Path {
		t.Errorf("Files: %v", f)
	}
}

func TestWriterSplits(t *testing.T) {
	c := Config{Path: filepath.Join(t.TempDir(), "console.log"), MaxBytes: MinMaxBytes, Keep: 3}
	w := openLog(c)
	var off int64
	for _, n := range []int64{1, MinMaxBytes - 1, 1, 3*MinMaxBytes + 7, 5, 2*MinMaxBytes - 13} {
		w.write(patternAt(off, n))
		off += n
	}
	w.close()
	if w.err != nil {
		t.Fatal(w.err)
	}
	got := readLog(t, c)
	if !bytes.Equal(got, patternAt(off-int64(len(got)), int64(len(got)))) {
		t.Errorf("the log is not the last %d bytes written", len(got))
	}
	// lazy rotation: a full current file stays until more comes.
	if len(got) != 3*MinMaxBytes {
		t.Errorf("log of %d bytes, want 3 full files", len(got))
	}
}
