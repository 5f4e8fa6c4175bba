package supervisor_test

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"net"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/vmsup/vmsup/internal/ops/qmppolicy"
	"github.com/vmsup/vmsup/storage"
	"github.com/vmsup/vmsup/supervisor"
)

// TestRawQMPHostFiles: raw QMP cannot make QEMU open a host file through
// the state directory (issue 45). A hard link there to a root-only file,
// or to one QEMU's user could read, is refused for blockdev-add; a name
// swapped between a good file and a symlink to a host file during raw
// blockdev-adds never gives QEMU the host file (every node that was added
// is a /dev/fdset/N whose descriptor holds the good file); and "json:"
// filenames with dotted keys (a host file, nbd, http, vvfat) are refused,
// with a listener on 127.0.0.1 showing no connection came.
func TestRawQMPHostFiles(t *testing.T) {
	ctx := ctxT(t, 5*time.Minute)
	root := t.TempDir()
	sup := newSup(t, root)
	f := guestFile(t, t.TempDir(), "rawf", `stop_timeout = "1s"`)
	if _, err := sup.Up(ctx, f); err != nil {
		t.Fatal(err)
	}
	defer sup.Down(context.WithoutCancel(ctx), "rawf")
	state := filepath.Join(root, "vms", "rawf")
	// Host files on the state directory's file system (a hard link needs
	// one): a root-only secret, and one any user reads.
	secret, readable := filepath.Join(root, "secret"), filepath.Join(root, "readable")
	writeFile(t, secret, "VMSUP-SECRET", 0o600)
	writeFile(t, readable, "VMSUP-HOSTFILE", 0o644)

	t.Run("hard link", func(t *testing.T) {
		for target, cause := range map[string]error{secret: os.ErrPermission, readable: storage.ErrHardLinked} {
			link := filepath.Join(state, "hl-"+filepath.Base(target))
			if err := os.Link(target, link); err != nil {
				t.Fatal(err)
			}
			cmd := fmt.Sprintf(`{"execute":"blockdev-add","arguments":{"driver":"file","node-name":"hl","read-only":true,"filename":%q}}`, link)
			_, err := sup.QMP(ctx, "rawf", []byte(cmd), false)
			if r := (*qmppolicy.Refusal)(nil); !errors.As(err, &r) || r.Class != qmppolicy.HostPath || !errors.Is(err, cause) {
				t.Errorf("blockdev-add of a hard link to %s: %v, want refused (host-path) for %v", target, err, cause)
			}
			t.Logf("hard link to %s: %v", filepath.Base(target), err)
		}
		if nodeNames(t, ctx, sup)["hl"] != "" {
			t.Error("a node hl exists")
		}
	})

	t.Run("symlink swap", func(t *testing.T) { symlinkSwap(t, ctx, sup, state, "/etc/passwd") })
	t.Run("json dotted", func(t *testing.T) { jsonDotted(t, ctx, sup, state) })
	t.Run("change medium", func(t *testing.T) { changeMedium(t, ctx, sup, state) })
}

// changeMedium: a medium in the state directory, named plainly or in a
// dotted "json:" filename, goes into an empty CD drive as an fd set,
// read-only as the drive is.
func changeMedium(t *testing.T, ctx context.Context, sup *supervisor.Supervisor, state string) {
	writeFile(t, filepath.Join(state, "seed.iso"), strings.Repeat("ISO!", 1024), 0o644)
	// A SCSI controller on a free hotplug root port (the last ones).
	var added bool
	for i := 16; i > 0 && !added; i-- {
		cmd := fmt.Sprintf(`{"execute":"device_add","arguments":{"driver":"virtio-scsi-pci","id":"scsi9","bus":"rp%d"}}`, i)
		_, err := sup.QMP(ctx, "rawf", []byte(cmd), false)
		added = err == nil
	}
	cmd := `{"execute":"device_add","arguments":{"driver":"scsi-cd","id":"cd9","bus":"scsi9.0"}}`
	if _, err := sup.QMP(ctx, "rawf", []byte(cmd), false); !added || err != nil {
		t.Fatalf("no SCSI controller on a free root port (%v), or %s: %v", added, cmd, err)
	}
	for _, fn := range []string{`"seed.iso"`, `"json:{\"file.driver\":\"file\",\"file.filename\":\"seed.iso\"}"`} {
		cmd := `{"execute":"blockdev-change-medium","arguments":{"id":"cd9","format":"raw","filename":` + fn + `}}`
		if _, err := sup.QMP(ctx, "rawf", []byte(cmd), false); err != nil {
			t.Fatalf("%s: %v", cmd, err)
		}
		out, err := sup.QMP(ctx, "rawf", []byte(`{"execute":"query-block"}`), false)
		if err != nil {
			t.Fatal(err)
		}
		var r struct {
			Return []struct {
				Qdev     string `json:"qdev"`
				Inserted *struct {
					File string `json:"file"`
					RO   bool   `json:"ro"`
				} `json:"inserted"`
			} `json:"return"`
		}
		if err := json.Unmarshal(out, &r); err != nil {
			t.Fatal(err)
		}
		found := false
		for _, b := range r.Return {
			if !strings.Contains(b.Qdev, "cd9") {
				continue
			}
			found = true
			if b.Inserted == nil || !strings.HasPrefix(b.Inserted.File, "/dev/fdset/") && !strings.Contains(b.Inserted.File, `"/dev/fdset/`) || !b.Inserted.RO {
				t.Errorf("change-medium %s: the drive has %+v, want a read-only /dev/fdset/N", fn, b.Inserted)
			}
			t.Logf("change-medium %s: the drive has %+v", fn, *b.Inserted)
		}
		if !found {
			t.Errorf("query-block has no cd9: %s", out)
		}
	}
}

// symlinkSwap flips the name "disk" in the state directory between a
// good file and a symlink to host during 150 raw blockdev-adds: no node
// may hold host's contents, and each added one is an fd set.
func symlinkSwap(t *testing.T, ctx context.Context, sup *supervisor.Supervisor, state, host string) {
	name := filepath.Join(state, "disk")
	good := bytes.Repeat([]byte("GOOD"), 1024)
	stop := make(chan struct{})
	var wg sync.WaitGroup
	wg.Go(func() {
		for i := 0; ; i++ {
			select {
			case <-stop:
				return
			default:
			}
			tmp := filepath.Join(state, ".swap")
			if i%2 == 0 {
				_ = os.WriteFile(tmp, good, 0o644)
			} else {
				_ = os.Symlink(host, tmp)
			}
			_ = os.Rename(tmp, name)
			time.Sleep(time.Millisecond) // the name spends time as each
		}
	})
	pid := qemuPID(t, "rawf")
	var added, refused, bad int
	why := map[string]int{}
	for i := range 150 {
		node := fmt.Sprintf("sw%d", i)
		cmd := fmt.Sprintf(`{"execute":"blockdev-add","arguments":{"driver":"file","node-name":%q,"read-only":true,"filename":"disk"}}`, node)
		_, err := sup.QMP(ctx, "rawf", []byte(cmd), false)
		if r := (*qmppolicy.Refusal)(nil); errors.As(err, &r) {
			refused++
			why[refusalKind(r.Reason)]++
			continue
		}
		if err != nil { // QEMU's own error: the name was missing mid-swap
			why["QEMU: "+refusalKind(err.Error())]++
			continue
		}
		added++
		file := nodeNames(t, ctx, sup)[node]
		content, err := fdSetContent(ctx, sup, pid, file)
		if err != nil || !bytes.HasPrefix(content, []byte("GOOD")) {
			bad++
			t.Errorf("node %s: file %q holds %.20q (%v)", node, file, content, err)
		}
		if _, err := sup.QMP(ctx, "rawf", []byte(`{"execute":"blockdev-del","arguments":{"node-name":"`+node+`"}}`), false); err != nil {
			t.Error(err)
		}
	}
	close(stop)
	wg.Wait()
	t.Logf("150 blockdev-adds: %d added (each the good file through an fd set), %d refused %v, %d with other contents", added, refused, why, bad)
}

// refusalKind is the gist of a refusal's reason, to count them by.
func refusalKind(reason string) string {
	for _, k := range []string{"leads through a symlink", "outside its directory or through a symlink", "no such file", "hard link"} {
		if strings.Contains(strings.ToLower(reason), k) {
			return k
		}
	}
	return reason
}

// jsonDotted: "json:" filenames with dotted keys are refused, and the nbd
// and http ones connect nowhere.
func jsonDotted(t *testing.T, ctx context.Context, sup *supervisor.Supervisor, state string) {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer ln.Close()
	conns := make(chan net.Conn, 8)
	go func() {
		for {
			c, err := ln.Accept()
			if err != nil {
				return
			}
			conns <- c
		}
	}()
	port := ln.Addr().(*net.TCPAddr).Port
	for _, c := range []struct {
		name, node string
		class      qmppolicy.Class
	}{
		{"raw file", `{"driver":"raw","file.driver":"file","file.filename":"/etc/passwd"}`, qmppolicy.HostPath},
		{"nbd", fmt.Sprintf(`{"driver":"raw","file.driver":"nbd","file.server.type":"inet","file.server.host":"127.0.0.1","file.server.port":"%d","file.export":"x"}`, port), qmppolicy.Outbound},
		{"http", fmt.Sprintf(`{"driver":"raw","file.driver":"http","file.url":"http://127.0.0.1:%d/x"}`, port), qmppolicy.Outbound},
		{"vvfat", `{"driver":"raw","file.driver":"vvfat","file.dir":"/etc"}`, qmppolicy.HostPath},
		{"legacy filename", `{"driver":"raw","filename":"/etc/passwd"}`, qmppolicy.Form},
	} {
		fn, _ := json.Marshal("json:" + c.node)
		for _, cmd := range []string{
			`{"execute":"blockdev-change-medium","arguments":{"id":"cd","format":"raw","filename":` + string(fn) + `}}`,
			`{"execute":"blockdev-add","arguments":{"driver":"file","node-name":"j","filename":` + string(fn) + `}}`,
		} {
			_, err := sup.QMP(ctx, "rawf", []byte(cmd), false)
			if r := (*qmppolicy.Refusal)(nil); !errors.As(err, &r) || r.Class != c.class {
				t.Errorf("%s: %s: %v, want refused (%s)", c.name, cmd, err, c.class)
			}
		}
	}
	select {
	case c := <-conns:
		c.Close()
		t.Error("QEMU connected to the listener")
	case <-time.After(500 * time.Millisecond):
	}
	b, _ := os.ReadFile(filepath.Join(filepath.Dir(filepath.Dir(state)), "records", "rawf", "qmp-security.log"))
	if n := strings.Count(string(b), `"verdict":"refused"`); n < 10 {
		t.Errorf("the security log has %d refusals, want the 10 of these", n)
	}
}

// nodeNames maps the VM's block nodes to their filenames.
func nodeNames(t *testing.T, ctx context.Context, sup *supervisor.Supervisor) map[string]string {
	t.Helper()
	out, err := sup.QMP(ctx, "rawf", []byte(`{"execute":"query-named-block-nodes","arguments":{"flat":true}}`), false)
	if err != nil {
		t.Fatal(err)
	}
	var r struct {
		Return []struct {
			NodeName string `json:"node-name"`
			File     string `json:"file"`
		} `json:"return"`
	}
	if err := json.Unmarshal(out, &r); err != nil {
		t.Fatal(err)
	}
	m := map[string]string{}
	for _, n := range r.Return {
		m[n.NodeName] = n.File
	}
	return m
}

// fdSetContent reads the start of the file QEMU holds in the fd set file
// names (/dev/fdset/N), through QEMU's own descriptor.
func fdSetContent(ctx context.Context, sup *supervisor.Supervisor, pid int, file string) ([]byte, error) {
	var set int64
	if _, err := fmt.Sscanf(file, "/dev/fdset/%d", &set); err != nil {
		return nil, fmt.Errorf("node file %q is not an fd set", file)
	}
	out, err := sup.QMP(ctx, "rawf", []byte(`{"execute":"query-fdsets"}`), false)
	if err != nil {
		return nil, err
	}
	var r struct {
		Return []struct {
			ID  int64 `json:"fdset-id"`
			FDs []struct {
				FD int `json:"fd"`
			} `json:"fds"`
		} `json:"return"`
	}
	if err := json.Unmarshal(out, &r); err != nil {
		return nil, err
	}
	for _, s := range r.Return {
		if s.ID == set && len(s.FDs) > 0 {
			b := make([]byte, 16)
			f, err := os.Open(fmt.Sprintf("/proc/%d/fd/%d", pid, s.FDs[0].FD))
			if err != nil {
				return nil, err
			}
			defer f.Close()
			n, err := f.Read(b)
			return b[:n], err
		}
	}
	return nil, fmt.Errorf("fd set %d is not in query-fdsets", set)
}

// qemuPID is the VM's QEMU among its unit's processes.
func qemuPID(t *testing.T, name string) int {
	t.Helper()
	for _, pid := range qemuPIDs(t, name) {
		if b, _ := os.ReadFile(fmt.Sprintf("/proc/%d/comm", pid)); strings.HasPrefix(string(b), "qemu") {
			return pid
		}
	}
	t.Fatalf("no QEMU in vmsup-%s.service", name)
	return 0
}

func writeFile(t *testing.T, path, content string, mode os.FileMode) {
	t.Helper()
	if err := os.WriteFile(path, []byte(content), mode); err != nil {
		t.Fatal(err)
	}
	if err := os.Chmod(path, mode); err != nil {
		t.Fatal(err)
	}
}

// TestRawQMPRefusalFlood: 2,000 refused 4 KiB commands (more than twice
// what the security log holds) leave an earlier --unsafe entry in
// qmp-security.log and earlier passed entries in qmp.log; the dropped
// refusals are counted in the logs' heads.
func TestRawQMPRefusalFlood(t *testing.T) {
	ctx := ctxT(t, 10*time.Minute)
	root := t.TempDir()
	sup := newSup(t, root)
	f := guestFile(t, t.TempDir(), "flood", `stop_timeout = "1s"`)
	if _, err := sup.Up(ctx, f); err != nil {
		t.Fatal(err)
	}
	defer sup.Down(context.WithoutCancel(ctx), "flood")
	unsafe := `{"execute":"no-such-command","id":"vmsup-flood-unsafe"}`
	if _, err := sup.QMP(ctx, "flood", []byte(unsafe), true); err == nil || !strings.Contains(err.Error(), "CommandNotFound") {
		t.Fatalf("--unsafe: %v, want QEMU's CommandNotFound", err)
	}
	for i := range 3 {
		if _, err := sup.QMP(ctx, "flood", fmt.Appendf(nil, `{"execute":"query-status","id":"vmsup-flood-admin-%d"}`, i), false); err != nil {
			t.Fatal(err)
		}
	}
	// Strings of 240 bytes, which the audit entry keeps whole: each
	// entry is as big as its 4 KiB command.
	var pad strings.Builder
	for k := range 16 {
		fmt.Fprintf(&pad, `,"k%d":"%s"`, k, strings.Repeat("p", 240))
	}
	start := time.Now()
	for i := range 2000 {
		cmd := fmt.Sprintf(`{"execute":"quit","id":"flood-%d","arguments":{"n":%d%s}}`, i, i, pad.String())
		if _, err := sup.QMP(ctx, "flood", []byte(cmd), false); !errors.As(err, new(*qmppolicy.Refusal)) {
			t.Fatalf("flood %d: %v", i, err)
		}
	}
	t.Logf("2000 refusals in %s", time.Since(start).Round(time.Millisecond))
	records := filepath.Join(root, "records", "flood")
	for _, c := range []struct {
		file string
		want []string
	}{
		{"qmp-security.log", []string{"vmsup-flood-unsafe", `"verdict":"unsafe"`, `"flood-1999"`}},
		{"qmp.log", []string{"vmsup-flood-unsafe", "vmsup-flood-admin-0", "vmsup-flood-admin-2", `"flood-1999"`}},
	} {
		b, err := os.ReadFile(filepath.Join(records, c.file))
		if err != nil {
			t.Fatal(err)
		}
		for _, w := range c.want {
			if !bytes.Contains(b, []byte(w)) {
				t.Errorf("%s lost %s", c.file, w)
			}
		}
		first, _, _ := bytes.Cut(b, []byte("\n"))
		if !bytes.Contains(first, []byte("more refusals suppressed")) {
			t.Errorf("%s starts %.200s, not a head counting the dropped refusals", c.file, first)
		}
		t.Logf("%s: %d bytes, head %.300s", c.file, len(b), first)
	}
}
