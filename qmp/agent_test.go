package qmp

import (
	"cmp"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"sync/atomic"
	"testing"

	"time"
)

// stripFF drops the 0xFF bytes a client sends to reset the agent's parser,
// as qemu-ga does.
type stripFF struct{ r io.Reader }

func (s stripFF) Read(p []byte) (int, error) {
	for {
		n, err := s.r.Read(p)
		m := 0
		for _, b := range p[:n] {
			if b != syncMarker {
				p[m] = b
				m++
			}
		}
		if m > 0 || err != nil {
			return m, err
		}
	}
}

// agentReply is how the fake agent answers a command: write the string (if
// any), then close the channel if closeAfter.
type agentReply struct {
	out        string
	closeAfter bool
	delay      time.Duration
}

// fakeAgent plays qemu-ga: it first writes stale bytes, answers
// guest-sync-delimited with the marker (preceded by syncPrefix), and answers
// other commands from handle.
func fakeAgent(t *testing.T, stale, syncPrefix string, handle func(cmd fakeCmd) agentReply) string {
	t.Helper()
	return fakeServer(t, func(c net.Conn, _ *json.Decoder) {
		io.WriteString(c, stale)
		dec := json.NewDecoder(stripFF{c})
		for {
			cmd, err := readCmd(dec)
			if err != nil {
				return
			}
			if cmd.Execute == "guest-sync-delimited" {
				var args struct{ ID int64 }
				json.Unmarshal(cmd.Arguments, &args)
				fmt.Fprintf(c, "%s\xff{\"return\": %d}\n", syncPrefix, args.ID)
				continue
			}
			r := handle(cmd)
			time.Sleep(r.delay)
			io.WriteString(c, r.out)
			if r.closeAfter {
				return
			}
		}
	})
}

func TestAgentSync(t *testing.T) {
	t.Parallel()
	ping := func(cmd fakeCmd) agentReply {
		if cmd.Execute == "guest-ping" {
			return agentReply{out: `{"return": {}}` + "\n"}
		}
		return agentReply{out: `{"error": {"class": "CommandNotFound", "desc": "x"}}` + "\n"}
	}
	tests := []struct {
		name, stale, syncPrefix string
	}{
		{"clean", "", ""},
		{"stale bytes", `partial {"ret` + "\xff garbage \xff{\"return\": 17}\n{\"return\": {}}\n", ""},
		{"stale replies before ours", "", `{"return": {}}` + "\n\xff{\"return\": 1}\n\xff{oops\n"},
		{"binary junk", "\x00\x01\x02\xfe\xff\xff\xff[1,", "\xff\"str\"\n"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			t.Parallel()
			sock := fakeAgent(t, tt.stale, tt.syncPrefix, ping)
			a, err := DialAgent(context.Background(), sock, WithConnectTimeout(time.Second))
			if err != nil {
				t.Fatalf("DialAgent: %v", err)
			}
			defer a.Close()
			if err := a.Ping(context.Background()); err != nil {
				t.Fatalf("Ping: %v", err)
			}
		})
	}
	t.Run("silent agent", func(t *testing.T) {
		t.Parallel()
		sock := fakeServer(t, func(c net.Conn, _ *json.Decoder) { io.Copy(io.Discard, c) })
		start := time.Now()
		_, err := DialAgent(context.Background(), sock, WithConnectTimeout(200*time.Millisecond))
		if !errors.Is(err, context.DeadlineExceeded) || time.Since(start) > 3*time.Second {
			t.Errorf("DialAgent = %v after %v, want DeadlineExceeded after ~200ms", err, time.Since(start))
		}
	})
}

func TestAgentCommands(t *testing.T) {
	t.Parallel()
	var polls atomic.Int32
	sock := fakeAgent(t, "", "", func(cmd fakeCmd) agentReply {
		replies := map[string]string{
			"guest-ping":       `{}`,
			"guest-info":       `{"version": "7.2.0", "supported_commands": [{"enabled": true, "name": "guest-ping", "success-response": true}, {"enabled": true, "name": "guest-shutdown", "success-response": false}]}`,
			"guest-get-osinfo": `{"kernel-release": "6.1.0-18-amd64", "id": "debian", "pretty-name": "Debian 12", "machine": "x86_64"}`,
			"guest-get-vcpus":  `[{"online": true, "can-offline": false, "logical-id": 0}, {"online": false, "can-offline": true, "logical-id": 1}]`,
			"guest-exec":       `{"pid": 4242}`,
		}
		switch {
		case cmd.Execute == "guest-exec-status" && polls.Add(1) < 3:
			return agentReply{out: `{"return": {"exited": false}}` + "\n"}
		case cmd.Execute == "guest-exec-status":
			return agentReply{out: `{"return": {"exited": true, "exitcode": 3, "out-data": "aGVsbG8K", "err-data": "b29wcw=="}}` + "\n"}
		case replies[cmd.Execute] != "":
			return agentReply{out: `{"return": ` + replies[cmd.Execute] + "}\n"}
		}
		return agentReply{out: `{"error": {"class": "CommandNotFound", "desc": "The command ` + cmd.Execute + ` has not been found"}}` + "\n"}
	})
	a, err := DialAgent(context.Background(), sock)
	if err != nil {
		t.Fatal(err)
	}
	defer a.Close()
	ctx := context.Background()

	info, err := a.Info(ctx)
	if err != nil || info.Version != "7.2.0" || len(info.SupportedCommands) != 2 || info.SupportedCommands[1].SuccessResponse {
		t.Errorf("Info = %+v, %v", info, err)
	}
	if os, err := a.OSInfo(ctx); err != nil || os.ID != "debian" || os.KernelRelease != "6.1.0-18-amd64" {
		t.Errorf("OSInfo = %+v, %v", os, err)
	}
	vcpus, err := a.GetVCPUs(ctx)
	if err != nil || len(vcpus) != 2 || !vcpus[0].Online || vcpus[1].Online || vcpus[1].LogicalID != 1 || !*vcpus[1].CanOffline {
		t.Errorf("GetVCPUs = %+v, %v", vcpus, err)
	}
	pid, err := a.Exec(ctx, "/bin/sh", []string{"-c", "echo hello; echo oops >&2; exit 3"}, true)
	if err != nil || pid != 4242 {
		t.Fatalf("Exec = %d, %v", pid, err)
	}
	st, err := a.ExecWait(ctx, pid, time.Millisecond)
	if err != nil || !st.Exited || *st.ExitCode != 3 || string(st.Stdout) != "hello\n" || string(st.Stderr) != "oops" {
		t.Errorf("ExecWait = %+v, %v", st, err)
	}
	if err := a.Execute(ctx, "guest-nope", nil, nil); !IsClass(err, ClassCommandNotFound) {
		t.Errorf("unknown command = %v, want CommandNotFound", err)
	}
}

// guest-shutdown answers only on failure.
func TestAgentShutdown(t *testing.T) {
	t.Parallel()
	tests := []struct {
		name    string
		reply   agentReply
		wantErr bool
	}{
		{"channel closes", agentReply{closeAfter: true}, false},
		{"silence", agentReply{}, false},
		{"error reply", agentReply{out: `{"error": {"class": "GenericError", "desc": "child process has failed to shutdown"}}` + "\n"}, true},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			t.Parallel()
			var mode atomic.Value
			sock := fakeAgent(t, "", "", func(cmd fakeCmd) agentReply {
				var args struct{ Mode string }
				json.Unmarshal(cmd.Arguments, &args)
				mode.Store(args.Mode)
				return tt.reply
			})
			a, err := DialAgent(context.Background(), sock)
			if err != nil {
				t.Fatal(err)
			}
			defer a.Close()
			ctx, cancel := context.WithTimeout(context.Background(), 200*time.Millisecond)
			defer cancel()
			err = a.Shutdown(ctx, "reboot")
			if tt.wantErr != IsClass(err, ClassGenericError) || (!tt.wantErr && err != nil) {
				t.Errorf("Shutdown = %v, want error %v", err, tt.wantErr)
			}
			if m := mode.Load(); m != "reboot" {
				t.Errorf("agent got mode %v", m)
			}
		})
	}
}

// Silence counts as shutdown success only if the command reached an agent
// that was in sync; an agent that stopped answering is an error.
func TestAgentShutdownDeadAgent(t *testing.T) {
	t.Parallel()
	sock := fakeServer(t, func(c net.Conn, _ *json.Decoder) {
		dec := json.NewDecoder(stripFF{c})
		cmd, err := readCmd(dec)
		if err != nil {
			return
		}
		var args struct{ ID int64 }
		json.Unmarshal(cmd.Arguments, &args)
		fmt.Fprintf(c, "\xff{\"return\": %d}\n", args.ID)
		io.Copy(io.Discard, c) // then the agent hangs
	})
	a, err := DialAgent(context.Background(), sock, WithCommandTimeout(100*time.Millisecond))
	if err != nil {
		t.Fatal(err)
	}
	defer a.Close()
	if err := a.Ping(context.Background()); !errors.Is(err, context.DeadlineExceeded) {
		t.Fatalf("Ping to a hung agent = %v, want DeadlineExceeded", err)
	}
	if err := a.Shutdown(context.Background(), ""); !errors.Is(err, context.DeadlineExceeded) {
		t.Errorf("Shutdown via a hung agent = %v, want DeadlineExceeded (resync failed)", err)
	}
}

// A reply that arrives after its command timed out must not be taken as the
// next command's reply.
func TestAgentResyncAfterTimeout(t *testing.T) {
	t.Parallel()
	sock := fakeAgent(t, "", "", func(cmd fakeCmd) agentReply {
		if cmd.Execute == "slow" {
			return agentReply{out: `{"return": "stale"}` + "\n", delay: 300 * time.Millisecond}
		}
		return agentReply{out: `{"return": "fresh"}` + "\n"}
	})
	a, err := DialAgent(context.Background(), sock, WithCommandTimeouts(map[string]time.Duration{"slow": 100 * time.Millisecond}))
	if err != nil {
		t.Fatal(err)
	}
	defer a.Close()
	var s string
	if err := a.Execute(context.Background(), "slow", nil, &s); !errors.Is(err, context.DeadlineExceeded) {
		t.Fatalf("slow command = %q, %v; want DeadlineExceeded", s, err)
	}
	ctx := context.Background()
	if err := a.Execute(ctx, "fast", nil, &s); err != nil || s != "fresh" {
		t.Fatalf("next command = %q, %v; want fresh", s, err)
	}
}

// TestAgentReal boots the test guest (scripts/build-guest.sh, with qemu-ga)
// and talks to its agent.
func TestAgentReal(t *testing.T) {
	// The guest scripts/build-guest.sh builds (scripts/test.sh runs it
	// first); not testenv.Guest, which would make qmp's tests import the
	// host probe, which imports qmp.
	kernel, initrd := os.Getenv("VMSUP_TEST_GUEST_KERNEL"), os.Getenv("VMSUP_TEST_GUEST_INITRD")
	if kernel == "" {
		dir := cmp.Or(os.Getenv("VMSUP_GUEST_DIR"), "/var/cache/vmsup/guest")
		kernel, initrd = filepath.Join(dir, "vmlinux"), filepath.Join(dir, "initramfs.cpio.gz")
		if _, err := os.Stat(initrd); err != nil {
			t.Skipf("no test guest (%v): run scripts/build-guest.sh, or set VMSUP_TEST_GUEST_KERNEL and _INITRD", err)
		}
	}
	dir := shortTempDir(t)
	qga := filepath.Join(dir, "qga.sock")
	console := filepath.Join(dir, "console.log")
	q := startQEMU(t, "-cpu", "max", "-m", "256", "-kernel", kernel, "-initrd", initrd,
		"-append", "console=ttyS0 no_timer_check", "-serial", "file:"+console,
		"-device", "virtio-serial",
		"-chardev", "socket,path="+qga+",server=on,wait=off,id=qga0",
		"-device", "virtserialport,chardev=qga0,name=org.qemu.guest_agent.0")
	c := dialQEMU(t, q)
	if err := c.Cont(context.Background()); err != nil {
		t.Fatal(err)
	}
	defer func() {
		if t.Failed() {
			b, _ := os.ReadFile(console)
			t.Logf("console:\n%s", b)
		}
	}()

	start := time.Now()
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()
	a, err := DialAgent(ctx, qga)
	if err != nil {
		t.Fatalf("DialAgent: %v", err)
	}
	defer a.Close()
	t.Logf("agent answered %v after cont", time.Since(start))
	if err := a.Ping(ctx); err != nil {
		t.Fatalf("Ping: %v", err)
	}
	info, err := a.Info(ctx)
	if err != nil || !slices.ContainsFunc(info.SupportedCommands, func(c AgentCommandInfo) bool { return c.Name == "guest-ping" }) {
		t.Fatalf("Info = %+v, %v", info, err)
	}
	t.Logf("qemu-ga %s, %d commands", info.Version, len(info.SupportedCommands))
	if v, err := a.GetVCPUs(ctx); err != nil || len(v) != 1 {
		t.Errorf("GetVCPUs = %+v, %v", v, err)
	}
	if pid, err := a.Exec(ctx, "/bin/sh", []string{"-c", "echo vmsup"}, true); err != nil {
		t.Logf("Exec /bin/sh not possible in this guest: %v", err)
	} else if st, err := a.ExecWait(ctx, pid, 0); err != nil || strings.TrimSpace(string(st.Stdout)) != "vmsup" {
		t.Errorf("ExecWait = %+v, %v", st, err)
	}

	// guest-shutdown replies only on failure; QEMU exits when the guest
	// powers off.
	sub, _ := c.Subscribe(ctx)
	start = time.Now()
	if err := a.Shutdown(ctx, "powerdown"); err != nil {
		t.Fatalf("Shutdown: %v", err)
	}
	t.Logf("Shutdown returned after %v", time.Since(start))
	if _, err := WaitEvent(ctx, sub, "SHUTDOWN", nil); err != nil {
		t.Fatalf("no SHUTDOWN event: %v", err)
	}
	t.Logf("SHUTDOWN event %v after guest-shutdown", time.Since(start))
}
