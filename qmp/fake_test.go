package qmp

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"time"
)

// A fake QMP server, only for what a real QEMU will not do on demand:
// garbage, silence, huge replies, dropped connections, reordered replies,
// event floods.

const greeting = `{"QMP": {"version": {"qemu": {"micro": 0, "minor": 2, "major": 7}, "package": "fake"}, "capabilities": ["oob"]}}` + "\r\n"

type fakeCmd struct {
	Execute   string          `json:"execute"`
	Arguments json.RawMessage `json:"arguments"`
	ID        json.RawMessage `json:"id"`
}

// fakeServer listens on a unix socket and runs handle for each connection.
// Handlers report problems with t.Errorf (never Fatal: they are goroutines).
func fakeServer(t *testing.T, handle func(c net.Conn, dec *json.Decoder)) string {
	t.Helper()
	sock := filepath.Join(shortTempDir(t), "fake.sock")
	ln, err := net.Listen("unix", sock)
	if err != nil {
		t.Fatal(err)
	}
	var wg sync.WaitGroup
	var mu sync.Mutex
	var conns []net.Conn
	wg.Add(1)
	go func() {
		defer wg.Done()
		for {
			c, err := ln.Accept()
			if err != nil {
				return
			}
			mu.Lock()
			conns = append(conns, c)
			mu.Unlock()
			wg.Add(1)
			go func() {
				defer wg.Done()
				defer c.Close()
				handle(c, json.NewDecoder(c))
			}()
		}
	}()
	t.Cleanup(func() {
		ln.Close()
		mu.Lock()
		for _, c := range conns {
			c.Close()
		}
		mu.Unlock()
		wg.Wait()
	})
	return sock
}

func readCmd(dec *json.Decoder) (fakeCmd, error) {
	var c fakeCmd
	err := dec.Decode(&c)
	return c, err
}

// handshake plays QEMU's side of greeting and qmp_capabilities.
func handshake(c net.Conn, dec *json.Decoder) error {
	if _, err := io.WriteString(c, greeting); err != nil {
		return err
	}
	cmd, err := readCmd(dec)
	if err != nil {
		return err
	}
	if cmd.Execute != "qmp_capabilities" {
		return fmt.Errorf("first command %q, want qmp_capabilities", cmd.Execute)
	}
	_, err = fmt.Fprintf(c, `{"return": {}, "id": %s}`+"\r\n", cmd.ID)
	return err
}

func dialFake(t *testing.T, sock string, opts ...Option) *Conn {
	t.Helper()
	c, err := Dial(context.Background(), sock, opts...)
	if err != nil {
		t.Fatalf("Dial: %v", err)
	}
	t.Cleanup(func() { c.Close() })
	return c
}

func TestFakeDialFailures(t *testing.T) {
	t.Parallel()
	const timeout = 200 * time.Millisecond
	tests := []struct {
		name     string
		server   func(c net.Conn, dec *json.Decoder)
		check    func(error) bool
		slowness time.Duration // how long Dial may take
	}{
		{
			name: "garbage greeting",
			server: func(c net.Conn, _ *json.Decoder) {
				io.WriteString(c, "hello\x00\xff garbage\n")
				io.Copy(io.Discard, c)
			},
			check:    func(err error) bool { return err != nil && !errors.Is(err, context.DeadlineExceeded) },
			slowness: time.Second, // generous: -race on a loaded 2-CPU host
		},
		{
			name:     "not a greeting",
			server:   func(c net.Conn, _ *json.Decoder) { io.WriteString(c, `{"return": {}}`); io.Copy(io.Discard, c) },
			check:    func(err error) bool { return err != nil && strings.Contains(err.Error(), "not a QMP greeting") },
			slowness: time.Second, // generous: -race on a loaded 2-CPU host
		},
		{
			name:     "silence",
			server:   func(c net.Conn, _ *json.Decoder) { io.Copy(io.Discard, c) },
			check:    func(err error) bool { return errors.Is(err, context.DeadlineExceeded) },
			slowness: timeout + 1500*time.Millisecond,
		},
		{
			name: "no capabilities reply",
			server: func(c net.Conn, dec *json.Decoder) {
				io.WriteString(c, greeting)
				readCmd(dec)
				io.Copy(io.Discard, c)
			},
			check:    func(err error) bool { return errors.Is(err, context.DeadlineExceeded) },
			slowness: timeout + 1500*time.Millisecond,
		},
		{
			name: "capabilities refused",
			server: func(c net.Conn, dec *json.Decoder) {
				io.WriteString(c, greeting)
				cmd, _ := readCmd(dec)
				fmt.Fprintf(c, `{"error": {"class": "GenericError", "desc": "no"}, "id": %s}`, cmd.ID)
				io.Copy(io.Discard, c)
			},
			check:    func(err error) bool { return IsClass(err, ClassGenericError) },
			slowness: time.Second, // generous: -race on a loaded 2-CPU host
		},
		{
			name: "closed after greeting",
			server: func(c net.Conn, dec *json.Decoder) {
				io.WriteString(c, greeting)
			},
			check:    func(err error) bool { return errors.Is(err, ErrClosed) },
			slowness: time.Second, // generous: -race on a loaded 2-CPU host
		},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			t.Parallel()
			sock := fakeServer(t, tt.server)
			start := time.Now()
			c, err := Dial(context.Background(), sock, WithConnectTimeout(timeout))
			took := time.Since(start)
			if err == nil {
				c.Close()
			}
			if !tt.check(err) || took > tt.slowness {
				t.Errorf("Dial = %v after %v; want a matching error within %v", err, took, tt.slowness)
			}
		})
	}
	t.Run("nobody listening", func(t *testing.T) {
		t.Parallel()
		_, err := Dial(context.Background(), filepath.Join(t.TempDir(), "none.sock"))
		if err == nil {
			t.Error("Dial to a missing socket succeeded")
		}
	})
}

func TestFakeLargeReply(t *testing.T) {
	t.Parallel()
	const size = 1 << 20
	sock := fakeServer(t, func(c net.Conn, dec *json.Decoder) {
		if handshake(c, dec) != nil {
			return
		}
		for {
			cmd, err := readCmd(dec)
			if err != nil {
				return
			}
			fmt.Fprintf(c, `{"return": "%s", "id": %s}`+"\r\n", strings.Repeat("x", size), cmd.ID)
		}
	})
	// -race makes decoding 1 MiB slow: allow more than the 500 ms default.
	c := dialFake(t, sock, WithCommandTimeout(10*time.Second))
	var s string
	if err := c.Execute(context.Background(), "big", nil, &s); err != nil || len(s) != size {
		t.Fatalf("Execute = %d bytes, %v; want %d", len(s), err, size)
	}
	out, err := c.ExecuteRaw(context.Background(), []byte(`{"execute":"big"}`))
	if err != nil || len(out) < size {
		t.Fatalf("ExecuteRaw = %d bytes, %v", len(out), err)
	}
}

// All pending commands fail at once when the connection drops mid-reply,
// long before their timeout.
func TestFakeDropMidReply(t *testing.T) {
	t.Parallel()
	const pending = 3
	sock := fakeServer(t, func(c net.Conn, dec *json.Decoder) {
		if handshake(c, dec) != nil {
			return
		}
		for range pending {
			if _, err := readCmd(dec); err != nil {
				return
			}
		}
		io.WriteString(c, `{"return": {"status": "runn`)
	})
	c := dialFake(t, sock, WithCommandTimeout(10*time.Second))
	start := time.Now()
	errs := make(chan error, pending)
	for range pending {
		go func() { errs <- c.Execute(context.Background(), "query-status", nil, nil) }()
	}
	for range pending {
		err := <-errs
		if !errors.Is(err, ErrClosed) || !errors.Is(err, io.ErrUnexpectedEOF) {
			t.Errorf("Execute = %v, want ErrClosed and io.ErrUnexpectedEOF", err)
		}
	}
	if took := time.Since(start); took > 2*time.Second {
		t.Errorf("pending commands failed after %v, want promptly (timeout is 10s)", took)
	}
	select {
	case <-c.Done():
	case <-time.After(time.Second):
		t.Error("Done not closed")
	}
}

func TestFakeGarbageMidStream(t *testing.T) {
	t.Parallel()
	sock := fakeServer(t, func(c net.Conn, dec *json.Decoder) {
		if handshake(c, dec) == nil {
			readCmd(dec)
			io.WriteString(c, "}}} not json\n")
			io.Copy(io.Discard, c)
		}
	})
	c := dialFake(t, sock, WithCommandTimeout(10*time.Second))
	if err := c.Execute(context.Background(), "query-status", nil, nil); !errors.Is(err, ErrClosed) {
		t.Errorf("Execute = %v, want ErrClosed", err)
	}
	<-c.Done()
}

// Replies are matched by id, whatever order they arrive in; replies with an
// unknown or missing id are ignored.
func TestFakeOutOfOrderReplies(t *testing.T) {
	t.Parallel()
	sock := fakeServer(t, func(c net.Conn, dec *json.Decoder) {
		if handshake(c, dec) != nil {
			return
		}
		var cmds []fakeCmd
		for range 2 {
			cmd, err := readCmd(dec)
			if err != nil {
				return
			}
			cmds = append(cmds, cmd)
		}
		io.WriteString(c, `{"return": "stray", "id": 99999}{"return": "no id"}{"return": "odd id", "id": "x"}`)
		for i := len(cmds) - 1; i >= 0; i-- {
			fmt.Fprintf(c, `{"return": %s, "id": %s}`+"\n", cmds[i].Arguments, cmds[i].ID)
		}
		io.Copy(io.Discard, c)
	})
	c := dialFake(t, sock)
	var wg sync.WaitGroup
	for _, want := range []string{"first", "second"} {
		wg.Add(1)
		go func() {
			defer wg.Done()
			var got struct{ Echo string }
			if err := c.Execute(context.Background(), "echo", struct{ Echo string }{want}, &got); err != nil || got.Echo != want {
				t.Errorf("Execute(%s) = %q, %v", want, got.Echo, err)
			}
		}()
	}
	wg.Wait()
}

// 10,000 events with a subscriber that never reads: the command behind them
// still completes, and the subscriber keeps the newest events.
func TestFakeEventFlood(t *testing.T) {
	t.Parallel()
	const events, buffer = 10000, 64
	sock := fakeServer(t, func(c net.Conn, dec *json.Decoder) {
		if handshake(c, dec) != nil {
			return
		}
		cmd, err := readCmd(dec)
		if err != nil {
			return
		}
		var b strings.Builder
		for i := range events {
			fmt.Fprintf(&b, `{"event": "FLOOD", "data": {"n": %d}, "timestamp": {"seconds": 1, "microseconds": 2}}`+"\r\n", i)
		}
		fmt.Fprintf(&b, `{"return": {}, "id": %s}`+"\r\n", cmd.ID)
		io.WriteString(c, b.String())
		io.Copy(io.Discard, c)
	})
	c := dialFake(t, sock, WithEventBuffer(buffer), WithCommandTimeout(5*time.Second))
	sub, unsub := c.Subscribe(context.Background())
	start := time.Now()
	if err := c.Execute(context.Background(), "flood", nil, nil); err != nil {
		t.Fatal(err)
	}
	t.Logf("command behind %d events with a stalled subscriber: %v", events, time.Since(start))
	if d := c.DroppedEvents(); d != events-buffer {
		t.Errorf("DroppedEvents = %d, want %d", d, events-buffer)
	}
	unsub()
	n := events - buffer
	for ev := range sub {
		if got := ev.Data["n"]; got != float64(n) || ev.Timestamp.Seconds != 1 {
			t.Fatalf("kept event %v, want n=%d", ev, n)
		}
		n++
	}
	if n != events {
		t.Errorf("subscriber kept events up to %d, want %d", n, events)
	}
}

// ExecuteRaw puts its own id on the wire and gives the caller's back.
func TestFakeExecuteRaw(t *testing.T) {
	t.Parallel()
	sock := fakeServer(t, func(c net.Conn, dec *json.Decoder) {
		if handshake(c, dec) != nil {
			return
		}
		for {
			var raw json.RawMessage
			if dec.Decode(&raw) != nil {
				return
			}
			var cmd fakeCmd
			json.Unmarshal(raw, &cmd)
			fmt.Fprintf(c, `{"return": {"wire-id": %s}, "id": %s}`, cmd.ID, cmd.ID)
		}
	})
	c := dialFake(t, sock)
	tests := []struct {
		in, wantID string
	}{
		{`{"execute":"x","id":"user-1"}`, `"user-1"`},
		{`{"execute":"x","id":{"a":[1]}}`, `{"a":[1]}`},
		{`{"execute":"x"}`, ``},
		{`{"exec-oob":"x","id":7}`, `7`},
	}
	for _, tt := range tests {
		out, err := c.ExecuteRaw(context.Background(), []byte(tt.in))
		var r map[string]json.RawMessage
		if err != nil || json.Unmarshal(out, &r) != nil || string(r["id"]) != tt.wantID || r["return"] == nil {
			t.Errorf("ExecuteRaw(%s) = %s, %v; want id %q", tt.in, out, err, tt.wantID)
		}
	}
	for _, bad := range []string{`[1]`, `{"arguments":{}}`, `{"execute":1}`, `not json`} {
		if _, err := c.ExecuteRaw(context.Background(), []byte(bad)); err == nil {
			t.Errorf("ExecuteRaw(%s) succeeded", bad)
		}
	}
}

// Close and ctx cancellation end a pending command at once.
func TestFakeCloseAndCancel(t *testing.T) {
	t.Parallel()
	sock := fakeServer(t, func(c net.Conn, dec *json.Decoder) {
		if handshake(c, dec) == nil {
			for {
				if _, err := readCmd(dec); err != nil {
					return
				}
			}
		}
	})
	c := dialFake(t, sock, WithCommandTimeout(10*time.Second))
	ctx, cancel := context.WithCancel(context.Background())
	time.AfterFunc(50*time.Millisecond, cancel)
	if err := c.Execute(ctx, "hang", nil, nil); !errors.Is(err, context.Canceled) {
		t.Errorf("Execute with canceled ctx = %v", err)
	}
	sub, _ := c.Subscribe(context.Background())
	errc := make(chan error, 1)
	go func() { errc <- c.Execute(context.Background(), "hang", nil, nil) }()
	time.Sleep(50 * time.Millisecond)
	start := time.Now()
	c.Close()
	if err := <-errc; !errors.Is(err, ErrClosed) || time.Since(start) > 2*time.Second {
		t.Errorf("pending Execute after Close = %v", err)
	}
	if _, ok := <-sub; ok {
		t.Error("subscriber channel open after Close")
	}
	if s, _ := c.Subscribe(context.Background()); s != nil {
		if _, ok := <-s; ok {
			t.Error("Subscribe after Close gave an open channel")
		}
	}
	if err := c.Execute(context.Background(), "x", nil, nil); !errors.Is(err, ErrClosed) {
		t.Errorf("Execute after Close = %v", err)
	}
	if err := c.Close(); err != nil {
		t.Errorf("second Close = %v", err)
	}
}

func TestCommandTimeouts(t *testing.T) {
	t.Parallel()
	idle := func(o *options) { o.load = func() float64 { return 1 } } // an idle host's bounds
	o := buildOptions([]Option{idle, WithCommandTimeouts(map[string]time.Duration{"device_add": time.Minute})})
	long := buildOptions([]Option{idle, WithCommandTimeout(10 * time.Second)})
	tests := []struct {
		o       options
		command string
		want    time.Duration
	}{
		{o, "query-status", DefaultCommandTimeout},
		{long, "qmp_capabilities", DefaultConnectTimeout},
		{o, "blockdev-add", 5 * time.Second},
		{o, "device_del", 5 * time.Second},
		{o, "device_add", time.Minute},
		{o, "migrate", 30 * time.Second},
		{o, "migrate-set-capabilities", 30 * time.Second},
		{o, "query-migrate", 30 * time.Second},
		{o, "query-qmp-schema", 30 * time.Second},
		{long, "query-status", 10 * time.Second},
		{long, "blockdev-del", 10 * time.Second},
		{long, "migrate", 30 * time.Second},
		{o, "transaction", 5 * time.Second},
		{o, "job-complete", 5 * time.Second},
		{o, "query-jobs", 5 * time.Second},
		{o, "nbd-server-start", 5 * time.Second},
		{o, "block-export-add", 5 * time.Second},
		{o, "query-block-exports", 5 * time.Second},
		{o, "blockdev-mirror", 5 * time.Second},
		{o, "block-job-cancel", 5 * time.Second},
	}
	for _, tt := range tests {
		if got := tt.o.timeoutFor(tt.command, DefaultCommandTimeout); got != tt.want {
			t.Errorf("timeout for %s = %v, want %v", tt.command, got, tt.want)
		}
	}
}
