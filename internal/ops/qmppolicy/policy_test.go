package qmppolicy

import (
	"bufio"
	"context"
	"encoding/binary"
	"encoding/json"
	"errors"
	"flag"
	"io"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/google/go-cmp/cmp"

	"github.com/vmsup/vmsup/qemuargs"
	"github.com/vmsup/vmsup/qmp"
)

var update = flag.Bool("update", false, "rewrite docs/qmp-policy.md from the table")

// testEnv is a VM's state directory with the files the rows name: an
// image, a qcow2 image whose header names an external data file, a symlink
// out of the directory and one to nothing. QEMU runs in it.
func testEnv(t *testing.T) Env {
	t.Helper()
	dir := filepath.Join(t.TempDir(), "vms", "web")
	if err := os.MkdirAll(dir, 0o700); err != nil {
		t.Fatal(err)
	}
	hdr := make([]byte, 104)
	copy(hdr, "QFI\xfb")
	binary.BigEndian.PutUint32(hdr[4:], 3)
	if err := os.WriteFile(filepath.Join(dir, "plain.qcow2"), hdr, 0o600); err != nil {
		t.Fatal(err)
	}
	binary.BigEndian.PutUint64(hdr[72:], 1<<2)
	if err := os.WriteFile(filepath.Join(dir, "datafile.qcow2"), hdr, 0o600); err != nil {
		t.Fatal(err)
	}
	for name, to := range map[string]string{"passwd": "/etc/passwd", "nowhere": "/tmp/vmsup-policy-nowhere/x", "inside": "plain.qcow2"} {
		if err := os.Symlink(to, filepath.Join(dir, name)); err != nil {
			t.Fatal(err)
		}
	}
	return Env{StateDir: dir, WorkDir: dir, Taps: []string{"vmsup-web-n0"}}
}

// TestEscapes: every form of raw QMP that reached the host in issue 30 (and
// the nested forms of the same) is refused, with its class.
func TestEscapes(t *testing.T) {
	env := testEnv(t)
	up := strings.Repeat("../", 12)
	for _, c := range []struct {
		name, cmd string
		class     Class
		want      string
	}{
		// Listeners.
		{"nbd-server inet", `{"execute":"nbd-server-start","arguments":{"addr":{"type":"inet","data":{"host":"0.0.0.0","port":"10809"}}}}`, Listener, "listens on the network"},
		{"hostfwd", `{"execute":"netdev_add","arguments":{"type":"user","id":"u1","hostfwd":[{"str":"tcp:0.0.0.0:2222-:22"}]}}`, Listener, "hostfwd"},
		{"netdev socket listen", `{"execute":"netdev_add","arguments":{"type":"socket","id":"s1","listen":"0.0.0.0:1234"}}`, Listener, `"socket"`},
		{"netdev stream server", `{"execute":"netdev_add","arguments":{"type":"stream","id":"s2","server":true,"addr":{"type":"inet","host":"0.0.0.0","port":"1235"}}}`, Listener, `"stream"`},
		{"netdev dgram", `{"execute":"netdev_add","arguments":{"type":"dgram","id":"s3","local":{"type":"inet","host":"0.0.0.0","port":"1236"}}}`, Listener, `"dgram"`},
		{"abstract chardev", `{"execute":"chardev-add","arguments":{"id":"c","backend":{"type":"socket","data":{"addr":{"type":"unix","data":{"path":"vmsup","abstract":true}},"server":true,"wait":false}}}}`, NotListed, "not on the allow-list"},
		{"nbd-server abstract", `{"execute":"nbd-server-start","arguments":{"addr":{"type":"unix","data":{"path":"x","abstract":true}}}}`, Listener, "abstract"},
		{"incoming tcp", `{"execute":"migrate-incoming","arguments":{"uri":"tcp:0.0.0.0:4444"}}`, Listener, "listens"},
		// Exports.
		{"writable export", `{"execute":"block-export-add","arguments":{"type":"nbd","id":"e","node-name":"disk-root","writable":true}}`, Export, "writable"},
		{"fuse export", `{"execute":"block-export-add","arguments":{"type":"fuse","id":"e","node-name":"disk-root","mountpoint":"/tmp/m"}}`, Export, "mounts"},
		{"migrate tcp", `{"execute":"migrate","arguments":{"uri":"tcp:127.0.0.1:4444"}}`, Export, "sends the guest's memory"},
		// Outbound connections.
		{"nbd", `{"execute":"blockdev-add","arguments":{"driver":"nbd","node-name":"n","server":{"type":"inet","host":"10.0.0.1","port":"10809"}}}`, Outbound, `driver "nbd" connects`},
		{"http", `{"execute":"blockdev-add","arguments":{"driver":"http","node-name":"h","url":"http://10.0.0.1/x"}}`, Outbound, `"http"`},
		{"ssh", `{"execute":"blockdev-add","arguments":{"driver":"ssh","node-name":"s","server":{"host":"10.0.0.1"},"path":"x"}}`, Outbound, `"ssh"`},
		{"iscsi", `{"execute":"blockdev-add","arguments":{"driver":"iscsi","node-name":"i","transport":"tcp","portal":"10.0.0.1","target":"iqn.x:y","lun":0}}`, Outbound, `"iscsi"`},
		{"nested nbd", `{"execute":"blockdev-add","arguments":{"driver":"raw","node-name":"q","file":{"driver":"nbd","server":{"type":"unix","path":"/run/x.sock"}}}}`, Outbound, `file: driver "nbd"`},
		{"backing http", `{"execute":"blockdev-add","arguments":{"driver":"qcow2","node-name":"q","file":{"driver":"file","filename":"plain.qcow2"},"backing":{"driver":"http","url":"http://10.0.0.1/x"}}}`, Outbound, `backing: driver "http"`},
		{"json: filename", `{"execute":"blockdev-change-medium","arguments":{"id":"cd","filename":"json:{\"driver\":\"http\",\"url\":\"http://10.0.0.1/x\"}","format":"raw"}}`, Outbound, `"json:": driver "http"`},
		{"nbd:// filename", `{"execute":"blockdev-change-medium","arguments":{"id":"cd","filename":"nbd://10.0.0.1/x","format":"raw"}}`, Outbound, `protocol "nbd"`},
		{"file json: filename", `{"execute":"blockdev-add","arguments":{"driver":"file","node-name":"j","filename":"json:{\"driver\":\"ssh\",\"path\":\"x\"}"}}`, Outbound, `"ssh"`},
		{"guestfwd", `{"execute":"netdev_add","arguments":{"type":"user","id":"u3","guestfwd":[{"str":"tcp:10.0.2.100:80-tcp:10.0.0.1:80"}]}}`, Outbound, "guestfwd"},
		// Relative paths, resolved against QEMU's working directory.
		{"etc/passwd from /", `{"execute":"blockdev-add","arguments":{"driver":"file","node-name":"p","filename":"etc/passwd","read-only":true}}`, HostPath, "relative to QEMU's working directory /"},
		{"../ out of the state dir", `{"execute":"blockdev-add","arguments":{"driver":"file","node-name":"p","filename":"` + up + `etc/passwd","read-only":true}}`, HostPath, "relative to QEMU's working directory"},
		{"vvfat", `{"execute":"blockdev-add","arguments":{"driver":"vvfat","node-name":"v","dir":"etc"}}`, HostPath, "host directory"},
		{"rng file", `{"execute":"object-add","arguments":{"qom-type":"rng-random","id":"r","filename":"` + up + `etc/shadow"}}`, HostPath, "filename"},
		{"secret file", `{"execute":"object-add","arguments":{"qom-type":"secret","id":"s","file":"` + up + `etc/passwd"}}`, HostPath, "file"},
		{"blkdebug", `{"execute":"blockdev-add","arguments":{"driver":"blkdebug","node-name":"b","config":"etc/passwd","image":{"driver":"null-co"}}}`, HostPath, "debugging driver"},
		{"symlink out", `{"execute":"blockdev-add","arguments":{"driver":"file","node-name":"l","filename":"passwd"}}`, HostPath, "symlink to /etc/passwd"},
		{"symlink to nothing", `{"execute":"migrate","arguments":{"uri":"unix:nowhere"}}`, HostPath, "symlink to nothing"},
		// Host paths.
		{"absolute", `{"execute":"blockdev-add","arguments":{"driver":"file","node-name":"a","filename":"/etc/hostname"}}`, HostPath, "outside the VM's state directory"},
		{"file: prefix", `{"execute":"blockdev-change-medium","arguments":{"id":"cd","filename":"file:/etc/hostname","format":"raw"}}`, HostPath, "outside"},
		{"host_device", `{"execute":"blockdev-add","arguments":{"driver":"host_device","node-name":"d","filename":"/dev/sda"}}`, HostPath, "/dev/fdset/N"},
		{"mem-path", `{"execute":"object-add","arguments":{"qom-type":"memory-backend-file","id":"m","mem-path":"/dev/shm/x","size":1048576}}`, HostPath, "mem-path"},
		{"romfile", `{"execute":"device_add","arguments":{"driver":"virtio-net-pci","id":"n","netdev":"x","romfile":"/etc/passwd"}}`, HostPath, "romfile"},
		{"loader", `{"execute":"device_add","arguments":{"driver":"loader","file":"/etc/passwd","addr":0}}`, HostPath, "loader"},
		{"tftp", `{"execute":"netdev_add","arguments":{"type":"user","id":"u4","tftp":"/etc"}}`, HostPath, "tftp"},
		{"qcow2 backing from header", `{"execute":"blockdev-add","arguments":{"driver":"qcow2","node-name":"q","file":{"driver":"file","filename":"plain.qcow2"}}}`, HostPath, `"backing"`},
		{"qcow2 data file from header", `{"execute":"blockdev-add","arguments":{"driver":"qcow2","node-name":"q","backing":null,"file":{"driver":"file","filename":"datafile.qcow2"}}}`, HostPath, "external data file"},
		{"commit backing-file", `{"execute":"block-commit","arguments":{"device":"d","backing-file":"/etc/passwd"}}`, HostPath, "backing-file"},
		// Programs.
		{"guestfwd cmd", `{"execute":"netdev_add","arguments":{"type":"user","id":"u2","guestfwd":[{"str":"tcp:10.0.2.100:1234-cmd:cat /etc/passwd"}]}}`, Program, "guestfwd"},
		{"migrate exec", `{"execute":"migrate","arguments":{"uri":"exec:cat > /tmp/x"}}`, Program, "runs a program"},
		{"tap script", `{"execute":"netdev_add","arguments":{"type":"tap","id":"t","ifname":"vmsup-web-n0","script":"/bin/true","downscript":"no"}}`, Program, "runs a program"},
		{"tap default script", `{"execute":"netdev_add","arguments":{"type":"tap","id":"t","ifname":"vmsup-web-n0"}}`, Program, "/etc/qemu-if"},
		{"tap helper", `{"execute":"netdev_add","arguments":{"type":"tap","id":"t","helper":"/usr/lib/qemu/qemu-bridge-helper"}}`, Program, "helper"},
		{"smb", `{"execute":"netdev_add","arguments":{"type":"user","id":"u5","smb":"/etc"}}`, Program, "smbd"},
		{"HMP", `{"execute":"human-monitor-command","arguments":{"command-line":"gdbserver tcp::1234"}}`, Form, `only "info ..." passes`},
		// Descriptors.
		{"tap fd", `{"execute":"netdev_add","arguments":{"type":"tap","id":"t","fd":"3","script":"no","downscript":"no"}}`, Descriptor, "file descriptor"},
		{"migrate fd", `{"execute":"migrate","arguments":{"uri":"fd:3"}}`, Descriptor, "file descriptor"},
		{"getfd", `{"execute":"getfd","arguments":{"fdname":"x"}}`, Descriptor, "not on the allow-list"},
		// The rest.
		{"quit", `{"execute":"quit"}`, Ends, "use vmsup down"},
		{"dump", `{"execute":"dump-guest-memory","arguments":{"paging":false,"protocol":"file:/root/dump"}}`, HostPath, "writes a host file"},
		{"screendump outside", `{"execute":"screendump","arguments":{"filename":"/root/.bashrc"}}`, HostPath, "outside the VM's state directory"},
		{"screendump through a symlink", `{"execute":"screendump","arguments":{"filename":"passwd"}}`, HostPath, "passwd"},
		{"spice password", `{"execute":"set_password","arguments":{"protocol":"spice","password":"x"}}`, Form, "only \"vnc\""},
		{"unknown", `{"execute":"inject-nmi"}`, NotListed, "not on the allow-list"},
		{"chardev file", `{"execute":"chardev-add","arguments":{"id":"c","backend":{"type":"file","data":{"out":"/etc/cron.d/x"}}}}`, NotListed, ""},
		{"other tap", `{"execute":"netdev_add","arguments":{"type":"tap","id":"t","ifname":"vmsup-db-n0","script":"no","downscript":"no"}}`, Form, "not a tap vmsup made for this VM"},
		{"qcow2 on a node name", `{"execute":"blockdev-add","arguments":{"driver":"qcow2","node-name":"q","backing":null,"file":"disk-a-file"}}`, Form, "inline"},
		{"transaction", `{"execute":"transaction","arguments":{"actions":[{"type":"blockdev-snapshot-sync","data":{"device":"d","snapshot-file":"/tmp/x","format":"qcow2"}}]}}`, NotListed, "blockdev-snapshot-sync"},
		{"medium probe", `{"execute":"blockdev-change-medium","arguments":{"id":"cd","filename":"x.iso"}}`, Form, `only "raw"`},
		{"duplicate key", `{"execute":"blockdev-add","arguments":{"driver":"file","node-name":"x","filename":"x.img","filename":"/etc/passwd"}}`, Malformed, "duplicate key"},
		{"exec-oob", `{"execute":"query-status","exec-oob":"quit"}`, Malformed, "exec-oob"},
		{"NUL", `{"execute":"blockdev-add","arguments":{"driver":"file","node-name":"x","filename":"x\u0000"}}`, Malformed, "NUL"},
		{"not json", `not json`, Malformed, "not a QMP command"},
	} {
		t.Run(c.name, func(t *testing.T) {
			e := env
			if c.name == "etc/passwd from /" {
				e.WorkDir = "/" // a QEMU started before vmsup gave it its state directory
			}
			err := Check([]byte(c.cmd), e)
			var r *Refusal
			if !errors.As(err, &r) {
				t.Fatalf("%s: passed (%v)", c.cmd, err)
			}
			if r.Class != c.class || !strings.Contains(r.Error(), c.want) || !strings.HasSuffix(r.Error(), "(vmsup qmp --unsafe passes it)") {
				t.Fatalf("%s:\n got %s: %v\nwant %s: %q", c.cmd, r.Class, r, c.class, c.want)
			}
			t.Logf("%s: %v", r.Class, r)
		})
	}
}

// TestAllowed: the read-only queries and vmsup's own forms, with the
// paths in the state directory, pass; the forms come from the types vmsup
// sends where there are some.
func TestAllowed(t *testing.T) {
	env := testEnv(t)
	js := func(v any) string {
		b, err := json.Marshal(v)
		if err != nil {
			t.Fatal(err)
		}
		return string(b)
	}
	cmd := func(execute string, args any) string {
		return js(map[string]any{"execute": execute, "arguments": args})
	}
	ram, dimm := qemuargs.DIMM("dimm1", 128<<20, qemuargs.MemoryPlace{})
	slot := int64(1)
	sock := filepath.Join(env.StateDir, "nbd.sock")
	for _, c := range []string{
		`{"execute":"query-status","id":7}`,
		`{"execute":"query-named-block-nodes","arguments":{"flat":true}}`,
		`{"execute":"qom-list","arguments":{"path":"/machine/peripheral"}}`,
		`{"execute":"human-monitor-command","arguments":{"command-line":"info registers"}}`,
		`{"execute":"stop"}`, `{"execute":"cont"}`, `{"execute":"system_powerdown"}`, `{"execute":"system_reset"}`,
		cmd("set_link", map[string]any{"name": "nic-n0", "up": false}),
		cmd("screendump", map[string]any{"filename": filepath.Join(env.StateDir, "screendump-0a1b.ppm")}),
		cmd("set_password", map[string]any{"protocol": "vnc", "password": "s3cret"}),
		cmd("expire_password", map[string]any{"protocol": "vnc", "time": "+60"}),
		cmd("balloon", map[string]any{"value": 256 << 20}),
		cmd("block_set_io_throttle", qmp.IOThrottle{ID: "disk-a", IOPS: 100}),
		cmd("qom-set", map[string]any{"path": "/machine/peripheral/balloon0", "property": "guest-stats-polling-interval", "value": 2}),
		cmd("device_del", map[string]any{"id": "disk-a"}),
		cmd("object-add", ram),
		cmd("device_add", dimm),
		cmd("device_add", qemuargs.CPUDevice{Driver: "qemu64-x86_64-cpu", ID: "cpu1", CPUSlot: qemuargs.CPUSlot{SocketID: &slot}}),
		cmd("device_add", qemuargs.Device{Driver: "virtio-blk-pci", ID: "disk-b", Drive: "disk-b", Bus: "rp1"}),
		cmd("blockdev-add", qemuargs.Blockdev{Driver: "file", NodeName: "b-file", Filename: filepath.Join(env.StateDir, "b.img")}),
		cmd("blockdev-add", qemuargs.Blockdev{Driver: "file", NodeName: "c-file", Filename: "c.img"}),
		cmd("blockdev-add", qemuargs.Blockdev{Driver: "file", NodeName: "fd-file", Filename: "/dev/fdset/3"}),
		cmd("blockdev-add", qemuargs.Blockdev{Driver: "raw", NodeName: "b", File: "b-file"}),
		cmd("blockdev-add", qemuargs.Blockdev{Driver: "host_device", NodeName: "dev", Filename: "/dev/fdset/4"}),
		`{"execute":"blockdev-add","arguments":{"driver":"qcow2","node-name":"q","backing":null,"file":{"driver":"file","filename":"inside"}}}`,
		`{"execute":"blockdev-add","arguments":{"driver":"qcow2","node-name":"q","backing":"b","data-file":"b-file","file":{"driver":"file","filename":"datafile.qcow2"}}}`,
		`{"execute":"blockdev-change-medium","arguments":{"id":"cd","filename":"seed.iso","format":"raw"}}`,
		cmd("blockdev-del", map[string]any{"node-name": "b"}),
		cmd("block-commit", qmp.Commit{Device: "disk-a", TopNode: "top", BaseNode: "base"}),
		cmd("blockdev-backup", qmp.Backup{Device: "disk-a", Target: "t", Sync: "full"}),
		cmd("transaction", map[string]any{"actions": []qmp.TransactionAction{qmp.SnapshotAction("disk-a", "ov"), qmp.BitmapClearAction("disk-a", "b0")}}),
		cmd("netdev_add", qemuargs.Netdev{Type: "user", ID: "n1"}),
		cmd("netdev_add", qemuargs.Netdev{Type: "tap", ID: "n0", Ifname: "vmsup-web-n0", Script: "no", Downscript: "no"}),
		cmd("object-add", qemuargs.Object{QOMType: "secret", ID: "s", File: filepath.Join(env.StateDir, "secret")}),
		cmd("object-add", qemuargs.Object{QOMType: "rng-random", ID: "r", Filename: "/dev/urandom"}),
		cmd("object-add", qemuargs.Object{QOMType: "iothread", ID: "io1"}),
		cmd("migrate", map[string]any{"uri": "unix:" + filepath.Join(env.StateDir, "mig.sock")}),
		cmd("migrate-set-capabilities", map[string]any{"capabilities": []any{map[string]any{"capability": "events", "state": true}}}),
		cmd("nbd-server-start", map[string]any{"addr": map[string]any{"type": "unix", "data": map[string]any{"path": sock}}}),
		`{"execute":"block-export-add","arguments":{"type":"nbd","id":"e","node-name":"disk-a","name":"a","bitmaps":["b0"]}}`,
	} {
		if err := Check([]byte(c), env); err != nil {
			t.Errorf("%s: %v", c, err)
		}
	}
}

// TestUnknownWorkDir: with QEMU's working directory unknown, a relative
// path is refused; an absolute one in the state directory passes.
func TestUnknownWorkDir(t *testing.T) {
	env := testEnv(t)
	env.WorkDir = ""
	err := Check([]byte(`{"execute":"object-add","arguments":{"qom-type":"secret","id":"s","file":"secret"}}`), env)
	if r := (*Refusal)(nil); !errors.As(err, &r) || r.Class != HostPath || !strings.Contains(r.Reason, "unknown") {
		t.Errorf("relative path with the working directory unknown: %v", err)
	}
	if err := Check([]byte(`{"execute":"object-add","arguments":{"qom-type":"secret","id":"s","file":"`+env.StateDir+`/secret"}}`), env); err != nil {
		t.Errorf("absolute path in the state directory: %v", err)
	}
}

// TestTable: the table names each command once, with its group, and says
// what passes where it checks.
func TestTable(t *testing.T) {
	seen := map[string]bool{}
	for _, r := range Rules() {
		if seen[r.Command] {
			t.Errorf("%s listed twice", r.Command)
		}
		seen[r.Command] = true
		if r.Group < Queries || r.Group > Display {
			t.Errorf("%s: group %d", r.Command, r.Group)
		}
		if (r.check == nil) != (r.Allows == "") {
			t.Errorf("%s: a checker must say what it allows, and only a checker", r.Command)
		}
	}
}

// TestDoc: docs/qmp-policy.md is the table's rendering (-update rewrites it).
func TestDoc(t *testing.T) {
	path := filepath.Join("..", "..", "..", "docs", "qmp-policy.md")
	got := Markdown()
	if *update {
		if err := os.WriteFile(path, []byte(got), 0o644); err != nil {
			t.Fatal(err)
		}
	}
	want, err := os.ReadFile(path)
	if err != nil {
		t.Fatal(err)
	}
	if d := cmp.Diff(string(want), got); d != "" {
		t.Errorf("%s is not the table's rendering (go test ./internal/ops/qmppolicy -run TestDoc -update) (-file +table):\n%s", path, d)
	}
}

// TestTableInSchema: every command the table names is one the installed
// QEMU has (query-qmp-schema of a QEMU with no machine): a typo would
// refuse a command for ever.
func TestTableInSchema(t *testing.T) {
	bin, err := exec.LookPath("qemu-system-x86_64")
	if err != nil {
		t.Skip("needs qemu-system-x86_64 (scripts/install-deps.sh)")
	}
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	// The schema's reply is read to its end before QEMU goes: a "quit"
	// sent with it could end QEMU before a loaded host had read the whole
	// reply (the schema has 0 commands, seen once in a full run).
	q := exec.CommandContext(ctx, bin, "-machine", "none", "-nodefaults", "-display", "none", "-qmp", "stdio")
	in, err := q.StdinPipe()
	if err != nil {
		t.Fatal(err)
	}
	stdout, err := q.StdoutPipe()
	if err != nil {
		t.Fatal(err)
	}
	if err := q.Start(); err != nil {
		t.Fatalf("%s: %v", bin, err)
	}
	defer func() { q.Process.Kill(); q.Wait() }()
	io.WriteString(in, `{"execute":"qmp_capabilities"}`+"\n"+`{"execute":"query-qmp-schema"}`+"\n")
	have := map[string]bool{}
	rd := bufio.NewReader(stdout)
	for len(have) == 0 {
		l, err := rd.ReadString('\n')
		if err != nil {
			t.Fatalf("%s: no schema: %v", bin, err)
		}
		var r struct {
			Return []struct {
				Name     string `json:"name"`
				MetaType string `json:"meta-type"`
			} `json:"return"`
		}
		if json.Unmarshal([]byte(l), &r) == nil {
			for _, e := range r.Return {
				if e.MetaType == "command" {
					have[e.Name] = true
				}
			}
		}
	}
	if len(have) < 100 {
		t.Fatalf("the schema has %d commands", len(have))
	}
	for _, r := range Rules() {
		if !have[r.Command] {
			t.Errorf("%s is not a command of %s", r.Command, bin)
		}
	}
}
