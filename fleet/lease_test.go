package fleet

import (
	"bytes"
	"context"
	"crypto/tls"
	"io"
	"log/slog"
	"net"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"go.etcd.io/etcd/client/pkg/v3/transport"
	clientv3 "go.etcd.io/etcd/client/v3"
	"go.uber.org/zap"

	"github.com/vmsup/vmsup/internal/dev/testenv/etcdtest"
)

// TestWatchdogQuorum runs an agent's lease and watchdog on a 3-member etcd
// (TLS) whose every answer comes 250 ms late each way (a loaded host: what
// made the full suite's agents fence themselves after quorum came back),
// beside a peer agent that reaches etcd directly. Two members down for
// twice the TTL, then back: the agent never fences itself (the one member
// left has no leader, and the peer sees the same). All three down for
// twice the TTL, then back: no self-fence either (no etcd for the peer
// either). Then the agent's own network to etcd goes dead (its renewals
// hang) while the peer reaches etcd: it fences itself between TTL - margin
// and a second later, before the lease could expire.
func TestWatchdogQuorum(t *testing.T) {
	ctx := t.Context()
	c, err := etcdtest.Start(ctx, t.TempDir(), etcdtest.Options{Members: 3, TLS: true})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { c.Close() })
	var eps []string
	var proxies []*slowProxy
	for _, ep := range c.Endpoints() {
		p := startSlowProxy(t, strings.TrimPrefix(ep, "https://"), 250*time.Millisecond)
		proxies = append(proxies, p)
		eps = append(eps, "https://"+p.addr)
	}
	tc, err := transport.TLSInfo{CertFile: c.CertFile, KeyFile: c.KeyFile, TrustedCAFile: c.CAFile}.ClientConfig()
	if err != nil {
		t.Fatal(err)
	}
	cl, err := clientv3.New(clientv3.Config{Endpoints: eps, DialTimeout: 2 * time.Second, TLS: tc, Logger: zap.NewNop(), DialOptions: DialOptions()})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { cl.Close() })
	srv, cli, err := PeerTLS(c.CAFile, c.CertFile, c.KeyFile)
	if err != nil {
		t.Fatal(err)
	}
	logs := &syncBuffer{}
	a := &Agent{Store: NewStore(cl, "/t/"), Host: Host{Name: "h"}, State: t.TempDir(), ClientTLS: cli,
		TTL: 6 * time.Second, SelfFenceMargin: 2 * time.Second, Log: slog.New(slog.NewTextHandler(logs, &slog.HandlerOptions{Level: slog.LevelDebug}))}
	a.init()
	if err := a.register(ctx); err != nil {
		t.Fatal(err)
	}
	peerLogs := startPeer(t, c, srv, cli)
	snap, err := a.Store.Load(ctx, false)
	if err != nil {
		t.Fatal(err)
	}
	a.learn(snap)
	if peers, _ := a.known.peers(); len(peers) != 1 || peers["p"] == "" {
		t.Fatalf("the agent knows peers %v; want p and its port", peers)
	}
	actx, cancel := context.WithCancel(ctx)
	var wg sync.WaitGroup
	wg.Go(func() { a.keepAlive(actx) })
	wg.Go(func() { a.watchdog(actx) })
	defer func() { cancel(); wg.Wait() }()

	for _, outage := range []struct {
		what    string
		members []int
	}{{"quorum lost", []int{0, 1}}, {"etcd down", []int{0, 1, 2}}} {
		for _, i := range outage.members {
			if err := c.StopMember(i); err != nil {
				t.Fatal(err)
			}
		}
		time.Sleep(2 * a.TTL)
		if err := c.RestartMembers(ctx, outage.members...); err != nil {
			t.Fatal(err)
		}
		time.Sleep(a.TTL)
		if strings.Contains(logs.String(), "self-fence") {
			t.Fatalf("%s: the agent fenced itself though no scheduler could act, then renewed:\n%s\npeer:\n%s", outage.what, logs, peerLogs)
		}
		if _, last := a.lease.get(); time.Since(last) > a.TTL/2 {
			t.Fatalf("%s: no renewal for %s after etcd came back:\n%s", outage.what, time.Since(last), logs)
		}
		t.Logf("%s for %s and back: renewing, no self-fence", outage.what, 2*a.TTL)
	}
	t.Logf("the agent's log:\n%s", logs)

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
		t.Fatalf("no self-fence %s after the last renewal on a dead network (the peer reaches etcd):\n%s", took, logs)
	}
	if min, max := a.TTL-a.SelfFenceMargin, a.TTL-a.SelfFenceMargin+1500*time.Millisecond; took < min || took > max {
		t.Errorf("self-fence %s after the last renewal; want %s-%s (the lease lasts %s)", took, min, max, a.TTL)
	}
	t.Logf("dead network, peer reaching etcd: self-fence %s after the last renewal (TTL %s, margin %s)", took.Round(time.Millisecond), a.TTL, a.SelfFenceMargin)
}

// startPeer runs a second agent ("p") on c, straight to its members (no
// proxy), taking questions on a port; it returns its log.
func startPeer(t *testing.T, c *etcdtest.Cluster, srv, cli *tls.Config) *syncBuffer {
	t.Helper()
	pc, err := c.Client(t.Context())
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { pc.Close() })
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	logs := &syncBuffer{}
	p := &Agent{Store: NewStore(pc, "/t/"), Host: Host{Name: "p", Migration: Endpoint{Receiver: l.Addr().String()}}, State: t.TempDir(),
		Listener: l, ServerTLS: srv, ClientTLS: cli, TTL: 6 * time.Second, SelfFenceMargin: 2 * time.Second, Log: slog.New(slog.NewTextHandler(logs, nil))}
	p.init()
	if err := p.register(t.Context()); err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(t.Context())
	var wg sync.WaitGroup
	wg.Go(func() { p.serve(ctx) })
	wg.Go(func() { p.keepAlive(ctx) })
	wg.Go(func() { p.watchdog(ctx) })
	t.Cleanup(func() { cancel(); wg.Wait() })
	return logs
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
