package qmppolicy

import (
	"encoding/json"
	"errors"
	"path/filepath"
	"strings"
	"testing"
)

// TestDottedSpellings: a block node spelled nested, dotted, or mixed, in a
// "json:" filename or in blockdev-add's arguments, gets the nested form's
// verdict; a spelling the expansion cannot read as QEMU would is refused.
func TestDottedSpellings(t *testing.T) {
	env := testEnv(t)
	medium := func(node string) string {
		b, _ := json.Marshal("json:" + node)
		return `{"execute":"blockdev-change-medium","arguments":{"id":"cd","format":"raw","filename":` + string(b) + `}}`
	}
	add := func(args string) string { return `{"execute":"blockdev-add","arguments":` + args + `}` }
	for _, c := range []struct {
		name, cmd string
		class     Class // 0 = passes
	}{
		{"medium dotted file", medium(`{"driver":"raw","file.driver":"file","file.filename":"/etc/passwd"}`), HostPath},
		{"medium nested file", medium(`{"driver":"raw","file":{"driver":"file","filename":"/etc/passwd"}}`), HostPath},
		{"medium mixed file", medium(`{"driver":"raw","file":{"driver":"file"},"file.filename":"/etc/passwd"}`), HostPath},
		{"medium dotted nbd", medium(`{"file.driver":"nbd","file.server.type":"inet","file.server.host":"127.0.0.1","file.server.port":"10809"}`), Outbound},
		{"medium dotted http", medium(`{"driver":"raw","file.driver":"http","file.url":"http://127.0.0.1:1/x"}`), Outbound},
		{"medium dotted vvfat", medium(`{"driver":"raw","file.driver":"vvfat","file.dir":"/etc"}`), HostPath},
		{"medium deep dotted", medium(`{"driver":"raw","file.driver":"raw","file.file.driver":"file","file.file.filename":"/etc/passwd"}`), HostPath},
		{"medium legacy filename", medium(`{"driver":"raw","filename":"/etc/passwd"}`), Form},
		{"medium escaped dot", medium(`{"driver":"raw","file..driver":"file"}`), Form},
		{"medium value and object", medium(`{"driver":"raw","file":"disk-a","file.driver":"file"}`), Form},
		{"medium other driver", medium(`{"driver":"null-co"}`), Form},
		{"medium dotted in state dir", medium(`{"driver":"raw","file.driver":"file","file.filename":"seed.iso"}`), 0},
		{"add dotted file", add(`{"driver":"raw","node-name":"r","file.driver":"file","file.filename":"/etc/passwd"}`), HostPath},
		{"add dotted json in file", add(`{"driver":"raw","node-name":"r","file.driver":"file","file.filename":"json:{\"driver\":\"nbd\",\"server.type\":\"inet\",\"server.host\":\"127.0.0.1\",\"server.port\":\"1\"}"}`), Outbound},
		{"add dotted backing", add(`{"driver":"qcow2","node-name":"q","file":{"driver":"file","filename":"plain.qcow2"},"backing.driver":"file","backing.filename":"/etc/passwd"}`), HostPath},
		{"add unknown option", add(`{"driver":"file","node-name":"f","filename":"x.img","x-unknown":1}`), Form},
		{"add list value", add(`{"driver":"raw","node-name":"r","file":"f","size":[1]}`), Form},
		{"add dotted in state dir", add(`{"driver":"raw","node-name":"r","file.driver":"file","file.filename":"x.img"}`), 0},
	} {
		t.Run(c.name, func(t *testing.T) {
			err := Check([]byte(c.cmd), env)
			var r *Refusal
			switch {
			case c.class == 0 && err != nil:
				t.Fatalf("%s: %v", c.cmd, err)
			case c.class == 0:
			case !errors.As(err, &r):
				t.Fatalf("%s: passed (%v)", c.cmd, err)
			case r.Class != c.class:
				t.Fatalf("%s: %s: %v, want %s", c.cmd, r.Class, r, c.class)
			default:
				t.Logf("%s: %v", r.Class, r)
			}
		})
	}
}

// TestDecideHostFiles: a passed command's state directory files are
// listed with their mode, and Encode names the replacement where each
// was, inside a "json:" filename too, in the checked (nested) form.
func TestDecideHostFiles(t *testing.T) {
	env := testEnv(t)
	for _, c := range []struct {
		name, cmd string
		modes     []Mode
		want      []string // in the encoded command
	}{
		{"file rw", `{"execute":"blockdev-add","arguments":{"driver":"file","node-name":"f","filename":"x.img"},"id":7}`,
			[]Mode{ReadWrite}, []string{`"filename":"/dev/fdset/1"`, `"id":7`}},
		{"dotted ro", `{"execute":"blockdev-add","arguments":{"driver":"raw","node-name":"r","read-only":true,"file.driver":"file","file.filename":"x.img"}}`,
			[]Mode{ReadOnly}, []string{`"file":{"driver":"file","filename":"/dev/fdset/1"}`}},
		{"qcow2 backing", `{"execute":"blockdev-add","arguments":{"driver":"qcow2","node-name":"q","file":{"driver":"file","filename":"plain.qcow2"},"backing":{"driver":"raw","file":{"driver":"file","filename":"b.img"}}}}`,
			[]Mode{ReadWrite, ReadOnly}, []string{`/dev/fdset/1`, `/dev/fdset/2`}},
		{"medium", `{"execute":"blockdev-change-medium","arguments":{"id":"cd","format":"raw","filename":"seed.iso"}}`,
			[]Mode{MediumMode}, []string{`"filename":"/dev/fdset/1"`}},
		{"medium json", `{"execute":"blockdev-change-medium","arguments":{"id":"cd","format":"raw","read-only-mode":"read-only","filename":"json:{\"file.driver\":\"file\",\"file.filename\":\"seed.iso\"}"}}`,
			[]Mode{ReadOnly}, []string{`"filename":"json:{\"driver\":\"raw\",\"file\":{\"driver\":\"file\",\"filename\":\"/dev/fdset/1\"}}"`}},
		{"fdset", `{"execute":"blockdev-add","arguments":{"driver":"file","node-name":"f","filename":"/dev/fdset/3"}}`, nil, []string{`/dev/fdset/3`}},
	} {
		t.Run(c.name, func(t *testing.T) {
			d, err := Decide([]byte(c.cmd), env)
			if err != nil {
				t.Fatal(err)
			}
			if len(d.Files) != len(c.modes) {
				t.Fatalf("%d files, want %d", len(d.Files), len(c.modes))
			}
			for i, f := range d.Files {
				if f.Mode != c.modes[i] || !filepath.IsAbs(f.Path) || filepath.Dir(f.Path) != env.StateDir {
					t.Errorf("file %d: %+v, want mode %s in %s", i, f, c.modes[i], env.StateDir)
				}
				if f.Mode == MediumMode && f.Device != "cd" {
					t.Errorf("medium file's device %q", f.Device)
				}
				f.Replace("/dev/fdset/" + string(rune('1'+i)))
			}
			out, err := d.Encode()
			if err != nil {
				t.Fatal(err)
			}
			for _, w := range c.want {
				if !strings.Contains(string(out), w) {
					t.Errorf("encoded %s, want %s in it", out, w)
				}
			}
			if strings.Contains(string(out), ".img") || strings.Contains(string(out), "seed.iso") {
				t.Errorf("encoded %s still names a file", out)
			}
			if _, err := Parse(out); err != nil {
				t.Errorf("the encoded command: %v", err)
			}
		})
	}
}
