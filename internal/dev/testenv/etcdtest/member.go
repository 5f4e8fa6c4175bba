package etcdtest

import (
	"context"
	"errors"
	"fmt"
	"math/rand/v2"
	"net"
	"net/url"
	"os"
	"strconv"
	"strings"
	"syscall"
	"time"

	"go.etcd.io/etcd/server/v3/embed"
	"go.uber.org/zap"
	"go.uber.org/zap/zapcore"
)

// member is one etcd server of the cluster; its URLs and directories stay
// the same across StopMember and RestartMember.
type member struct {
	name      string
	dataDir   string
	logFile   string
	clientURL url.URL
	peerURL   url.URL
	etcd      *embed.Etcd // nil while stopped
}

// config is the embed configuration for m; state is "new" for the first
// start and "existing" for restarts from m's data directory.
func (c *Cluster) config(m *member, state string) *embed.Config {
	cfg := embed.NewConfig()
	cfg.Name = m.name
	cfg.Dir = m.dataDir
	cfg.ListenClientUrls = []url.URL{m.clientURL}
	cfg.AdvertiseClientUrls = []url.URL{m.clientURL}
	cfg.ListenPeerUrls = []url.URL{m.peerURL}
	cfg.AdvertisePeerUrls = []url.URL{m.peerURL}
	cfg.InitialCluster = c.initialCluster
	cfg.InitialClusterToken = "etcdtest"
	cfg.ClusterState = state
	cfg.TickMs = uint(c.opts.HeartbeatInterval.Milliseconds())
	cfg.ElectionMs = uint(c.opts.ElectionTimeout.Milliseconds())
	// Durability across a machine crash is of no use to a test, and
	// fsyncs slow everything down on a busy machine; clean stops still
	// leave a complete data directory for RestartMember.
	cfg.UnsafeNoFsync = true
	// The logger is ours so that it writes to a file and not the test output.
	cfg.ZapLoggerBuilder = embed.NewZapLoggerBuilder(newLogger(m.logFile, zapcore.InfoLevel).Named(m.name))
	if c.opts.TLS {
		cfg.ClientTLSInfo.CertFile = c.tls.serverCert
		cfg.ClientTLSInfo.KeyFile = c.tls.serverKey
		cfg.ClientTLSInfo.TrustedCAFile = c.tls.ca
		cfg.ClientTLSInfo.ClientCertAuth = true
	}
	return cfg
}

// start starts m's server without waiting for it to join the cluster: the
// members of a new cluster only become ready once enough of them run.
func (c *Cluster) start(m *member, state string) error {
	e, err := embed.StartEtcd(c.config(m, state))
	// A restart listens on the ports the member had: one its last run's
	// connections still hold for a moment is waited for, up to 2 s.
	for try := 0; state == "existing" && errors.Is(err, syscall.EADDRINUSE) && try < 20; try++ {
		time.Sleep(100 * time.Millisecond)
		e, err = embed.StartEtcd(c.config(m, state))
	}
	if err != nil {
		return fmt.Errorf("etcdtest: start %s: %w (log: %s)", m.name, err, m.logFile)
	}
	m.etcd = e
	return nil
}

// stop closes m's server if it runs; Close waits for its goroutines and
// listeners to be gone.
func (m *member) stop() {
	if m.etcd != nil {
		m.etcd.Close()
		m.etcd = nil
	}
}

// waitReady waits until m has joined the cluster and serves clients.
func (m *member) waitReady(ctx context.Context) error {
	e := m.etcd
	select {
	case <-e.Server.ReadyNotify():
		return nil
	case err := <-e.Err():
		return fmt.Errorf("etcdtest: %s failed before ready: %v (log: %s)", m.name, err, m.logFile)
	case <-e.Server.StopNotify():
		return fmt.Errorf("etcdtest: %s stopped before ready (log: %s)", m.name, m.logFile)
	case <-ctx.Done():
		return fmt.Errorf("etcdtest: %s not ready: %w (log: %s)", m.name, ctx.Err(), m.logFile)
	}
}

// pickPorts returns n distinct TCP ports free on ip. They are taken below the
// kernel's ephemeral range when it leaves room, so that the outgoing
// connections of peers and clients cannot grab a port while its member is
// stopped and RestartMember can listen on it again.
func pickPorts(ip string, n int) ([]int, error) {
	lo, hi := 10000, ephemeralLow()
	if hi-lo < 1000 {
		lo, hi = 0, 0 // no room: let the kernel choose
	}
	var held []net.Listener
	defer func() {
		for _, l := range held {
			l.Close()
		}
	}()
	// Every listener stays open until all are chosen, so the ports differ.
	for tries := 0; len(held) < n; tries++ {
		if tries > 100*n {
			return nil, fmt.Errorf("etcdtest: no %d free ports on %s", n, ip)
		}
		port := 0
		if hi > lo {
			port = lo + rand.IntN(hi-lo)
		}
		l, err := net.Listen("tcp", net.JoinHostPort(ip, strconv.Itoa(port)))
		if err != nil {
			if port == 0 {
				return nil, err
			}
			continue
		}
		held = append(held, l)
	}
	ports := make([]int, n)
	for i, l := range held {
		ports[i] = l.Addr().(*net.TCPAddr).Port
	}
	return ports, nil
}

// ephemeralLow is the first port of the kernel's ephemeral range.
func ephemeralLow() int {
	b, err := os.ReadFile("/proc/sys/net/ipv4/ip_local_port_range")
	if err != nil {
		return 0
	}
	f := strings.Fields(string(b))
	if len(f) != 2 {
		return 0
	}
	low, err := strconv.Atoi(f[0])
	if err != nil {
		return 0
	}
	return low
}

// newLogger is a JSON zap logger appending to path. It opens the file for
// each entry: nobody has to close it, and a client that outlives its
// cluster can still log.
func newLogger(path string, level zapcore.Level) *zap.Logger {
	enc := zap.NewProductionEncoderConfig()
	enc.EncodeTime = zapcore.RFC3339NanoTimeEncoder
	w := zapcore.AddSync(appendFile(path))
	return zap.New(zapcore.NewCore(zapcore.NewJSONEncoder(enc), w, level), zap.ErrorOutput(w))
}

// appendFile is an io.Writer that appends each write to the named file.
type appendFile string

func (p appendFile) Write(b []byte) (int, error) {
	f, err := os.OpenFile(string(p), os.O_WRONLY|os.O_APPEND|os.O_CREATE, 0o644)
	if err != nil {
		return 0, err
	}
	n, err := f.Write(b)
	return n, errors.Join(err, f.Close())
}
