package fleet

import (
	"bytes"
	"context"
	"io"
	"log/slog"
	"net"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	clientv3 "go.etcd.io/etcd/client/v3"
	"go.uber.org/zap"

	"github.com/vmsup/vmsup/internal/testenv/etcdtest"
)

// TestWatchdogQuorum runs an agent's lease and watchdog on a 3-member etcd
// whose every answer comes 250 ms late each way (a loaded host: what made
// the full suite's agents fence themselves after quorum came back). Two
// members down for twice the TTL, then one back: the agent never fences
// itself. Then the network goes dead (renewals hang): it fences itself
// between TTL - margin and a second later, before the lease could expire.
func TestWatchdogQuorum(t *testing.T) {
	ctx := t.Context()
	c, err := etcdtest.Start(ctx, t.TempDir(), etcdtest.Options{Members: 3})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { c.Close() })
	var eps []string
	var proxies []*slowProxy
	for _, ep := range c.Endpoints() {
		p := startSlowProxy(t, strings.TrimPrefix(ep, "http://"), 250*time.Millisecond)
		proxies = append(proxies, p)
		eps = append(eps, "http://"+p.addr)
	}
	cl, err := clientv3.New(clientv3.Config{Endpoints: eps, DialTimeout: 2 * time.Second, Logger: zap.NewNop()})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { cl.Close() })
	logs := &syncBuffer{}
	a := &Agent{Store: NewStore(cl, "/t/"), Host: Host{Name: "h"}, State: t.TempDir(),
		TTL: 6 * time.Second, SelfFenceMargin: 2 * time.Second, Log: slog.New(slog.NewTextHandler(logs, nil))}
	a.lease = &lease{store: a.Store, file: a.State + "/lease", ttl: a.TTL}
	if err := a.register(ctx); err != nil {
		t.Fatal(err)
	}
	actx, cancel := context.WithCancel(ctx)
	var wg sync.WaitGroup
	wg.Go(func() { a.keepAlive(actx) })
	wg.Go(func() { a.watchdog(actx) })
	defer func() { cancel(); wg.Wait() }()

	for _, i := range []int{0, 1} {
		if err := c.StopMember(i); err != nil {
			t.Fatal(err)
		}
	}
	time.Sleep(2 * a.TTL)
	if err := c.RestartMember(ctx, 1); err != nil {
		t.Fatal(err)
	}
	time.Sleep(a.TTL)
	if strings.Contains(logs.String(), "self-fence") {
		t.Fatalf("the agent fenced itself though etcd had no leader, then renewed:\n%s", logs)
	}
	if _, last := a.lease.get(); time.Since(last) > a.TTL/2 {
		t.Fatalf("no renewal for %s after quorum came back:\n%s", time.Since(last), logs)
	}
	t.Logf("quorum lost for %s and back: renewing, no self-fence:\n%s", 2*a.TTL, logs)

	_, last := a.lease.get()
	for _, p := range proxies {
		p.blackhole.Store(true)
	}
	deadline := time.Now().Add(a.TTL)
	for !a.isFenced() && time.Now().Before(deadline) {
		time.Sleep(50 * time.Millisecond)
	}
	took := time.Since(last)
	if !a.isFenced() {
		t.Fatalf("no self-fence %s after the last renewal on a dead network:\n%s", took, logs)
	}
	if min, max := a.TTL-a.SelfFenceMargin, a.TTL-a.SelfFenceMargin+1500*time.Millisecond; took < min || took > max {
		t.Errorf("self-fence %s after the last renewal; want %s-%s (the lease lasts %s)", took, min, max, a.TTL)
	}
	t.Logf("dead network: self-fence %s after the last renewal (TTL %s, margin %s)", took.Round(time.Millisecond), a.TTL, a.SelfFenceMargin)
}

// slowProxy forwards TCP to one etcd member, each chunk late by delay; a
// blackholed one forwards nothing (a dead network: calls hang).
type slowProxy struct {
	addr      string
	blackhole atomic.Bool
}

func startSlowProxy(t *testing.T, target string, delay time.Duration) *slowProxy {
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { l.Close() })
	p := &slowProxy{addr: l.Addr().String()}
	go func() {
		for {
			in, err := l.Accept()
			if err != nil {
				return
			}
			out, err := net.Dial("tcp", target)
			if err != nil {
				in.Close()
				continue
			}
			t.Cleanup(func() { in.Close(); out.Close() })
			go p.pipe(out, in, delay)
			go p.pipe(in, out, delay)
		}
	}()
	return p
}

func (p *slowProxy) pipe(dst, src net.Conn, delay time.Duration) {
	defer dst.Close()
	type chunk struct {
		b  []byte
		at time.Time
	}
	q := make(chan chunk, 1024)
	go func() {
		defer close(q)
		for {
			b := make([]byte, 32<<10)
			n, err := src.Read(b)
			if n > 0 {
				q <- chunk{b[:n], time.Now().Add(delay)}
			}
			if err != nil {
				return
			}
		}
	}()
	for c := range q {
		time.Sleep(time.Until(c.at))
		if p.blackhole.Load() {
			continue
		}
		if _, err := dst.Write(c.b); err != nil {
			io.Copy(io.Discard, src)
			return
		}
	}
}

type syncBuffer struct {
	mu sync.Mutex
	b  bytes.Buffer
}

func (s *syncBuffer) Write(p []byte) (int, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.b.Write(p)
}

func (s *syncBuffer) String() string {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.b.String()
}
