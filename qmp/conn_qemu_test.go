package qmp

import (
	"context"
	"encoding/json"
	"errors"
	"os"
	"path/filepath"
	"slices"
	"sort"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/digitalocean/go-qemu/qmp"
	"github.com/digitalocean/go-qemu/qmp/raw"
)

// Tests against a real QEMU 7.2 (TCG, no guest OS).

func TestQEMUQueries(t *testing.T) {
	t.Parallel()
	q := startQEMU(t, "-smp", "1,maxcpus=2")
	c := dialQEMU(t, q, WithCapabilities("oob", "no-such-cap"))
	ctx := context.Background()

	if g := c.Greeting(); g.Version.QEMU.Major < 7 || !slices.Contains(g.Capabilities, "oob") {
		t.Errorf("greeting = %+v, want QEMU >= 7 offering oob", g)
	}
	if got := c.Capabilities(); !slices.Equal(got, []string{"oob"}) {
		t.Errorf("enabled capabilities = %v, want [oob] (offered ones only)", got)
	}
	st, err := c.QueryStatus(ctx)
	if err != nil || st != (StatusInfo{Status: "prelaunch"}) {
		t.Errorf("QueryStatus = %+v, %v; want prelaunch, not running", st, err)
	}
	v, err := c.QueryVersion(ctx)
	if err != nil || v.QEMU != c.Greeting().Version.QEMU {
		t.Errorf("QueryVersion = %v, %v; greeting said %v", v, err, c.Greeting().Version)
	}
	if k, err := c.QueryKVM(ctx); err != nil || k.Enabled {
		t.Errorf("QueryKVM = %+v, %v; want not enabled under TCG", k, err)
	}
	if n, err := c.QueryName(ctx); err != nil || n != "vmsup-test" {
		t.Errorf("QueryName = %q, %v", n, err)
	}
	if cpus, err := c.QueryCPUsFast(ctx); err != nil || len(cpus) != 1 || cpus[0].Target != "x86_64" {
		t.Errorf("QueryCPUsFast = %+v, %v; want one x86_64 vCPU", cpus, err)
	}
	hp, err := c.QueryHotpluggableCPUs(ctx)
	if err != nil || len(hp) != 2 || hp[0].Props.SocketID == nil {
		t.Errorf("QueryHotpluggableCPUs = %+v, %v; want 2 slots with socket ids", hp, err)
	}
	if nodes, err := c.QueryNamedBlockNodes(ctx); err != nil || len(nodes) != 0 {
		t.Errorf("QueryNamedBlockNodes = %+v, %v; want none", nodes, err)
	}

	// Hotplug-style round trips with typed wrappers.
	if err := c.ObjectAdd(ctx, map[string]any{"qom-type": "memory-backend-ram", "id": "mem1", "size": 1 << 20}); err != nil {
		t.Errorf("ObjectAdd: %v", err)
	}
	if err := c.ObjectDel(ctx, "mem1"); err != nil {
		t.Errorf("ObjectDel: %v", err)
	}
	img := filepath.Join(t.TempDir(), "disk.raw")
	if err := os.WriteFile(img, make([]byte, 1<<20), 0o600); err != nil {
		t.Fatal(err)
	}
	type fileNode struct {
		Driver   string `json:"driver"`
		NodeName string `json:"node-name"`
		Filename string `json:"filename"`
	}
	if err := c.BlockdevAdd(ctx, fileNode{"file", "disk0", img}); err != nil {
		t.Fatalf("BlockdevAdd: %v", err)
	}
	nodes, err := c.QueryNamedBlockNodes(ctx)
	if err != nil || len(nodes) != 1 || nodes[0].NodeName != "disk0" || nodes[0].Image.VirtualSize != 1<<20 {
		t.Errorf("QueryNamedBlockNodes = %+v, %v; want disk0 of 1 MiB", nodes, err)
	}
	if err := c.BlockdevDel(ctx, "disk0"); err != nil {
		t.Errorf("BlockdevDel: %v", err)
	}
	if err := c.NetdevAdd(ctx, map[string]string{"type": "user", "id": "n0"}); err != nil {
		t.Errorf("NetdevAdd: %v", err)
	}
	if err := c.NetdevDel(ctx, "n0"); err != nil {
		t.Errorf("NetdevDel: %v", err)
	}
}

func TestQEMUErrorClasses(t *testing.T) {
	t.Parallel()
	c := dialQEMU(t, startQEMU(t))
	tests := []struct {
		name    string
		command string
		args    any
		class   string
	}{
		{"unknown command", "no-such-command", nil, ClassCommandNotFound},
		{"unexpected argument", "query-status", map[string]int{"bogus": 1}, ClassGenericError},
		{"missing argument", "device_del", nil, ClassGenericError},
		{"unknown device", "device_del", map[string]string{"id": "nope"}, ClassDeviceNotFound},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			err := c.Execute(context.Background(), tt.command, tt.args, nil)
			var qe *Error
			if !errors.As(err, &qe) || qe.Class != tt.class || qe.Command != tt.command || qe.Desc == "" {
				t.Fatalf("err = %#v, want *Error class %s for %s", err, tt.class, tt.command)
			}
			if !IsClass(err, tt.class) || IsClass(err, "Other") {
				t.Errorf("IsClass wrong for %v", err)
			}
		})
	}

	// ExecuteRaw returns the error reply as JSON too, with the caller's id.
	out, err := c.ExecuteRaw(context.Background(), []byte(`{"execute":"nope","id":"mine"}`))
	var r struct {
		ID    string `json:"id"`
		Error Error  `json:"error"`
	}
	if !IsClass(err, ClassCommandNotFound) || json.Unmarshal(out, &r) != nil || r.ID != "mine" || r.Error.Class != ClassCommandNotFound {
		t.Errorf("ExecuteRaw = %s, %v", out, err)
	}
	// The connection still works after errors.
	if _, err := c.QueryStatus(context.Background()); err != nil {
		t.Errorf("QueryStatus after errors: %v", err)
	}
}

// Two subscribers that read get every STOP/RESUME; a third that never reads
// does not slow 200 query-status commands and keeps only the newest events.
func TestQEMUEventsSlowSubscriber(t *testing.T) {
	t.Parallel()
	const buffer, cycles = 8, 20
	c := dialQEMU(t, startQEMU(t), WithEventBuffer(buffer))
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()

	var wg sync.WaitGroup
	got := make([][]string, 2)
	readers := make([]<-chan qmp.Event, 2)
	for i := range readers {
		readers[i], _ = c.Subscribe(ctx)
	}
	stalled, unsubStalled := c.Subscribe(ctx)
	for i, sub := range readers {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for ev := range sub {
				if ev.Event == "STOP" || ev.Event == "RESUME" {
					got[i] = append(got[i], ev.Event)
				}
				if len(got[i]) == 2*cycles {
					return
				}
			}
		}()
	}

	queries := 0
	for range cycles {
		for _, step := range []func(context.Context) error{c.Cont, c.Stop} {
			if err := step(ctx); err != nil {
				t.Fatal(err)
			}
			for range 5 {
				if _, err := c.QueryStatus(ctx); err != nil {
					t.Fatalf("QueryStatus #%d: %v", queries, err)
				}
				queries++
			}
		}
	}
	wg.Wait()
	want := slices.Repeat([]string{"RESUME", "STOP"}, cycles)
	for i := range got {
		if !slices.Equal(got[i], want) {
			t.Errorf("subscriber %d got %v, want %v", i, got[i], want)
		}
	}
	if d := c.DroppedEvents(); d != 2*cycles-buffer {
		t.Errorf("DroppedEvents = %d, want %d", d, 2*cycles-buffer)
	}
	unsubStalled()
	var kept []string
	for ev := range stalled {
		kept = append(kept, ev.Event)
	}
	if !slices.Equal(kept, want[len(want)-buffer:]) {
		t.Errorf("stalled subscriber kept %v, want the newest %d events", kept, buffer)
	}
	t.Logf("%d query-status with a stalled subscriber; %d events dropped", queries, c.DroppedEvents())
}

func TestQEMULargeReply(t *testing.T) {
	t.Parallel()
	c := dialQEMU(t, startQEMU(t))
	var schema []struct {
		Name    string `json:"name"`
		MetaTyp string `json:"meta-type"`
	}
	ctx := context.Background()
	if err := c.Execute(ctx, "query-qmp-schema", nil, &schema); err != nil {
		t.Fatal(err)
	}
	out, err := c.ExecuteRaw(ctx, []byte(`{"execute":"query-qmp-schema"}`))
	if err != nil {
		t.Fatal(err)
	}
	if len(out) <= 64<<10 || len(schema) < 100 {
		t.Fatalf("schema reply %d bytes, %d entries; want > 64 KiB", len(out), len(schema))
	}
	t.Logf("query-qmp-schema: %d bytes, %d entries", len(out), len(schema))
}

func TestQEMUFDPassing(t *testing.T) {
	t.Parallel()
	c := dialQEMU(t, startQEMU(t))
	ctx := context.Background()
	f, err := os.Create(filepath.Join(t.TempDir(), "disk.img"))
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()

	info, err := c.AddFD(ctx, nil, "vmsup:disk0", f)
	if err != nil {
		t.Fatalf("AddFD: %v", err)
	}
	sets, err := c.QueryFDSets(ctx)
	want := []FDSet{{FDSetID: info.FDSetID, FDs: []FDSetFD{{FD: info.FD, Opaque: "vmsup:disk0"}}}}
	if err != nil || !slices.EqualFunc(sets, want, func(a, b FDSet) bool {
		return a.FDSetID == b.FDSetID && slices.Equal(a.FDs, b.FDs)
	}) {
		t.Fatalf("QueryFDSets = %+v, %v; want %+v", sets, err, want)
	}
	// A second descriptor into the same set.
	id := info.FDSetID
	info2, err := c.AddFD(ctx, &id, "", f)
	if err != nil || info2.FDSetID != id || info2.FD == info.FD {
		t.Fatalf("AddFD into set %d = %+v, %v", id, info2, err)
	}
	if err := c.RemoveFD(ctx, id, nil); err != nil {
		t.Fatalf("RemoveFD: %v", err)
	}

	if err := c.GetFD(ctx, "fd0", f); err != nil {
		t.Fatalf("GetFD: %v", err)
	}
	if err := c.CloseFD(ctx, "fd0"); err != nil {
		t.Fatalf("CloseFD: %v", err)
	}
	// Closing again fails: proves QEMU had it under that name.
	if err := c.CloseFD(ctx, "fd0"); !IsClass(err, ClassGenericError) {
		t.Errorf("second CloseFD = %v, want GenericError", err)
	}
	// getfd without a descriptor is QEMU's error, not a hang.
	if err := c.Execute(ctx, "getfd", map[string]string{"fdname": "x"}, nil); !IsClass(err, ClassGenericError) {
		t.Errorf("getfd without SCM_RIGHTS = %v, want GenericError", err)
	}
}

func TestQEMUQuitClosesDone(t *testing.T) {
	t.Parallel()
	q := startQEMU(t)
	c := dialQEMU(t, q)
	sub, _ := c.Subscribe(context.Background())
	if err := c.Quit(context.Background()); err != nil {
		t.Fatalf("Quit: %v", err)
	}
	select {
	case <-c.Done():
	case <-time.After(5 * time.Second):
		t.Fatal("Done not closed after quit")
	}
	if err := c.Err(); !errors.Is(err, ErrClosed) {
		t.Errorf("Err = %v, want ErrClosed", err)
	}
	if _, err := c.QueryStatus(context.Background()); !errors.Is(err, ErrClosed) {
		t.Errorf("command after quit = %v, want ErrClosed", err)
	}
	ev, err := WaitEvent(context.Background(), sub, "SHUTDOWN", func(ev qmp.Event) bool {
		return ev.Data["reason"] == "host-qmp-quit"
	})
	if err != nil {
		t.Errorf("WaitEvent SHUTDOWN: %v", err)
	}
	t.Logf("event: %+v", ev)
	if _, err := WaitEvent(context.Background(), sub, "NEVER", nil); !errors.Is(err, ErrClosed) {
		t.Errorf("WaitEvent after quit = %v, want ErrClosed", err)
	}
	select {
	case <-q.exited:
	case <-time.After(5 * time.Second):
		t.Error("qemu did not exit after quit")
	}
}

// A SIGSTOPped QEMU accepts connections (the kernel does) but never
// answers: Dial and commands must time out, not hang.
func TestQEMUStopped(t *testing.T) {
	t.Parallel()
	q := startQEMU(t)
	c := dialQEMU(t, q, WithCommandTimeout(200*time.Millisecond))
	q.signal(t, syscall.SIGSTOP)

	start := time.Now()
	_, err := Dial(context.Background(), q.sock, WithConnectTimeout(300*time.Millisecond))
	if !errors.Is(err, context.DeadlineExceeded) || time.Since(start) > 3*time.Second {
		t.Errorf("Dial to stopped QEMU = %v after %v, want DeadlineExceeded after ~300ms", err, time.Since(start))
	}
	start = time.Now()
	_, err = c.QueryStatus(context.Background())
	if !errors.Is(err, context.DeadlineExceeded) || time.Since(start) > 3*time.Second {
		t.Errorf("QueryStatus on stopped QEMU = %v after %v, want DeadlineExceeded after ~200ms", err, time.Since(start))
	}
	t.Logf("timeout error: %v", err)

	// After SIGCONT the late reply is dropped and the connection works
	// (QEMU first works through its backlog: allow a few 200 ms attempts).
	q.signal(t, syscall.SIGCONT)
	var st StatusInfo
	for range 10 {
		if st, err = c.QueryStatus(context.Background()); err == nil {
			break
		}
	}
	if err != nil || st.Status != "prelaunch" {
		t.Errorf("QueryStatus after SIGCONT = %+v, %v", st, err)
	}
}

// Conn is a go-qemu qmp.Monitor: go-qemu's generated raw API runs on it.
func TestQEMUGoQemuMonitor(t *testing.T) {
	t.Parallel()
	c := dialQEMU(t, startQEMU(t))
	var m qmp.Monitor = c
	if err := m.Connect(); err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	events, err := m.Events(ctx)
	if err != nil {
		t.Fatal(err)
	}
	rm := raw.NewMonitor(m)
	if st, err := rm.QueryStatus(); err != nil || st.Status != raw.RunStatePrelaunch {
		t.Errorf("raw QueryStatus = %+v, %v", st, err)
	}
	if err := rm.Cont(); err != nil {
		t.Fatal(err)
	}
	if ev := <-events; ev.Event != "RESUME" {
		t.Errorf("event = %+v, want RESUME", ev)
	}
	cancel()
	if _, ok := <-events; ok {
		t.Error("Events channel not closed after ctx cancel")
	}
	if err := m.Disconnect(); err != nil || m.Connect() == nil {
		t.Errorf("Disconnect = %v; Connect after it should fail", err)
	}
}

// Round-trip latency of query-status, concurrently and serially (-v shows
// the figures).
func TestQEMURoundTrip(t *testing.T) {
	t.Parallel()
	c := dialQEMU(t, startQEMU(t))
	ctx := context.Background()

	var wg sync.WaitGroup
	for g := range 8 {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for i := range 50 {
				if _, err := c.QueryStatus(ctx); err != nil {
					t.Errorf("goroutine %d #%d: %v", g, i, err)
					return
				}
			}
		}()
	}
	wg.Wait()

	const n = 1000
	d := make([]time.Duration, n)
	for i := range d {
		start := time.Now()
		if _, err := c.QueryStatus(ctx); err != nil {
			t.Fatal(err)
		}
		d[i] = time.Since(start)
	}
	sort.Slice(d, func(i, j int) bool { return d[i] < d[j] })
	t.Logf("query-status round trip over %d: p50 %v, p99 %v, max %v", n, d[n/2], d[n*99/100], d[n-1])
	if d[n/2] > 50*time.Millisecond {
		t.Errorf("p50 %v is implausibly slow", d[n/2])
	}
}
