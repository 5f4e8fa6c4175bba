package caps

import (
	"strings"
	"testing"

	"github.com/vmsup/vmsup/spec"
)

// TestCheckFeatures: a disk's iothread_map is refused before start on a
// QEMU older than 9.0, naming the field, and passes on 10.
func TestCheckFeatures(t *testing.T) {
	f, err := spec.Parse("/vm/q.toml", []byte("name = \"q\"\nmemory = \"256M\"\niothreads = 2\n[[disk]]\nname = \"d\"\nfile = \"/d.img\"\niothread_map = [{ thread = 1 }, { thread = 2 }]\n"))
	if err != nil {
		t.Fatal(err)
	}
	for _, c := range []struct{ version, want string }{
		{"7.2.22", "disk[0].iothread_map: needs QEMU 9.0 or newer"},
		{"10.0.2", ""},
		{"", ""}, // a test's record
	} {
		caps := &Caps{}
		caps.QEMU.Version = c.version
		err := caps.CheckFeatures(f)
		if c.want == "" && err != nil || c.want != "" && (err == nil || !strings.Contains(err.Error(), c.want)) {
			t.Errorf("QEMU %q: %v, want %q", c.version, err, c.want)
		}
		if got, want := caps.IOThreadVQMapping(), c.version == "10.0.2"; got != want {
			t.Errorf("QEMU %q: IOThreadVQMapping %v", c.version, got)
		}
	}
}
