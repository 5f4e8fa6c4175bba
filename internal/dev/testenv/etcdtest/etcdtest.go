package etcdtest

import (
	"context"
	"crypto/tls"
	"crypto/x509"
	"errors"
	"fmt"
	"net"
	"net/url"
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"time"

	clientv3 "go.etcd.io/etcd/client/v3"
	"go.uber.org/zap/zapcore"
)

// Options shape a cluster; the zero value is a 3-member plain-http cluster
// on 127.0.0.1 with fast elections.
type Options struct {
	Members int    // number of members; default 3
	IP      string // address every member listens on for clients and peers; default "127.0.0.1"
	// TLS makes clients use https and present a certificate signed by the
	// cluster's CA (client-cert auth). Peers always use plain http on IP.
	TLS bool
	// ElectionTimeout and HeartbeatInterval default to 1s and 100ms, short
	// so that a test sees a new leader soon after stopping the old one.
	ElectionTimeout, HeartbeatInterval time.Duration
}

// Cluster is a running etcd cluster whose members are embedded servers in
// this process.
type Cluster struct {
	Dir string // holds the members' data directories, their logs and the PEM files
	// CAFile, CertFile and KeyFile are the client's TLS material when
	// Options.TLS: the CA that signed the servers' certificate (which
	// covers IP and 127.0.0.1), and a client certificate and its key.
	CAFile, CertFile, KeyFile string

	opts           Options
	tls            tlsFiles
	initialCluster string // "m0=http://IP:PORT,...", the same for every start

	mu      sync.Mutex // guards members' etcd; held through stops and starts
	members []*member
}

// readyTimeout bounds Start and RestartMember when their context has no
// deadline: a member that cannot join would otherwise hang the test.
const readyTimeout = 30 * time.Second

// Start starts a cluster with its data under dir (an empty directory, e.g.
// t.TempDir()) and returns when every member is ready and they agree on a
// leader. On error nothing is left running.
func Start(ctx context.Context, dir string, o Options) (*Cluster, error) {
	if o.Members == 0 {
		o.Members = 3
	}
	if o.IP == "" {
		o.IP = "127.0.0.1"
	}
	if o.ElectionTimeout == 0 {
		o.ElectionTimeout = time.Second
	}
	if o.HeartbeatInterval == 0 {
		o.HeartbeatInterval = 100 * time.Millisecond
	}
	ip := net.ParseIP(o.IP)
	if ip == nil || ip.IsUnspecified() {
		// Members advertise IP to each other and to clients.
		return nil, fmt.Errorf("etcdtest: IP %q is not a unicast address", o.IP)
	}
	if o.Members < 1 {
		return nil, fmt.Errorf("etcdtest: %d members", o.Members)
	}
	dir, err := filepath.Abs(dir)
	if err != nil {
		return nil, err
	}
	if err := os.MkdirAll(dir, 0o755); err != nil {
		return nil, err
	}
	c := &Cluster{Dir: dir, opts: o}
	scheme := "http"
	if o.TLS {
		if c.tls, err = writeCerts(dir, ip); err != nil {
			return nil, fmt.Errorf("etcdtest: certificates: %w", err)
		}
		c.CAFile, c.CertFile, c.KeyFile = c.tls.ca, c.tls.clientCert, c.tls.clientKey
		scheme = "https"
	}

	// A port picked free can be taken before its member listens on it (by
	// anything on the same address): then the cluster starts again on
	// others, from empty data directories.
	for attempt := 1; ; attempt++ {
		err := c.startNew(ctx, scheme)
		if err == nil {
			return c, nil
		}
		c.Close()
		if !errors.Is(err, syscall.EADDRINUSE) || attempt == 3 {
			return nil, err
		}
		for _, m := range c.members {
			os.RemoveAll(m.dataDir)
		}
		c.members = nil
	}
}

// startNew picks the members' ports and starts a new cluster on them.
func (c *Cluster) startNew(ctx context.Context, scheme string) error {
	o := c.opts
	ports, err := pickPorts(o.IP, 2*o.Members)
	if err != nil {
		return err
	}
	var initial []string
	for i := range o.Members {
		name := "m" + strconv.Itoa(i)
		m := &member{
			name:      name,
			dataDir:   filepath.Join(c.Dir, name),
			logFile:   filepath.Join(c.Dir, name+".log"),
			clientURL: url.URL{Scheme: scheme, Host: net.JoinHostPort(o.IP, strconv.Itoa(ports[2*i]))},
			peerURL:   url.URL{Scheme: "http", Host: net.JoinHostPort(o.IP, strconv.Itoa(ports[2*i+1]))},
		}
		c.members = append(c.members, m)
		initial = append(initial, name+"="+m.peerURL.String())
	}
	c.initialCluster = strings.Join(initial, ",")
	return c.startAll(ctx)
}

// startAll starts every member, then waits for all of them: StartEtcd
// returns before its member has joined, and no member becomes ready before
// a quorum runs. They start one after the other because a new member first
// asks its peers whether it was bootstrapped already, and a peer whose port
// is open but not yet served holds that question for a second; a closed port
// or a served one answers at once.
func (c *Cluster) startAll(ctx context.Context) error {
	c.mu.Lock()
	defer c.mu.Unlock()
	for _, m := range c.members {
		if err := c.start(m, "new"); err != nil {
			return err
		}
	}
	ctx, cancel := withDefaultTimeout(ctx)
	defer cancel()
	for _, m := range c.members {
		if err := m.waitReady(ctx); err != nil {
			return err
		}
	}
	return c.waitLeader(ctx)
}

// waitLeader waits until the running members all report the same leader.
// Caller holds c.mu.
func (c *Cluster) waitLeader(ctx context.Context) error {
	t := time.NewTicker(10 * time.Millisecond)
	defer t.Stop()
	for {
		var leaders []uint64
		for _, m := range c.members {
			if m.etcd != nil {
				leaders = append(leaders, uint64(m.etcd.Server.Leader()))
			}
		}
		if len(leaders) > 0 && leaders[0] != 0 && len(slices.Compact(slices.Clone(leaders))) == 1 {
			return nil
		}
		select {
		case <-ctx.Done():
			return fmt.Errorf("etcdtest: no agreed leader (%v): %w (logs: %s)", leaders, ctx.Err(), filepath.Join(c.Dir, "m*.log"))
		case <-t.C:
		}
	}
}

// Endpoints returns the client URLs of all members, stopped ones included,
// in member order; clients are expected to cope with dead endpoints.
func (c *Cluster) Endpoints() []string {
	eps := make([]string, len(c.members))
	for i, m := range c.members {
		eps[i] = m.clientURL.String()
	}
	return eps
}

// Client returns a client on all endpoints, with the client certificate when
// the cluster uses TLS. ctx is the client's context: when it is done, the
// client's calls fail, so pass a context that lives as long as the client
// (e.g. t.Context()). The caller closes the client. It logs to client.log in
// Dir.
func (c *Cluster) Client(ctx context.Context) (*clientv3.Client, error) {
	cfg := clientv3.Config{
		Endpoints:   c.Endpoints(),
		DialTimeout: 2 * time.Second,
		Context:     ctx,
		Logger:      newLogger(filepath.Join(c.Dir, "client.log"), zapcore.InfoLevel),
	}
	if c.opts.TLS {
		t, err := c.tlsConfig()
		if err != nil {
			return nil, err
		}
		cfg.TLS = t
	}
	return clientv3.New(cfg)
}

// tlsConfig trusts the cluster's CA and presents the client certificate.
func (c *Cluster) tlsConfig() (*tls.Config, error) {
	cert, err := tls.LoadX509KeyPair(c.CertFile, c.KeyFile)
	if err != nil {
		return nil, err
	}
	ca, err := os.ReadFile(c.CAFile)
	if err != nil {
		return nil, err
	}
	pool := x509.NewCertPool()
	if !pool.AppendCertsFromPEM(ca) {
		return nil, fmt.Errorf("etcdtest: no certificate in %s", c.CAFile)
	}
	return &tls.Config{RootCAs: pool, Certificates: []tls.Certificate{cert}, MinVersion: tls.VersionTLS12}, nil
}

// StopMember stops member i (0-based) cleanly, handing leadership on first
// if it leads; its data directory is kept for RestartMember.
func (c *Cluster) StopMember(i int) error {
	c.mu.Lock()
	defer c.mu.Unlock()
	m, err := c.member(i)
	if err != nil {
		return err
	}
	if m.etcd == nil {
		return fmt.Errorf("etcdtest: %s is not running", m.name)
	}
	m.stop()
	return nil
}

// RestartMember starts the stopped member i again from its data directory on
// the same ports, and waits until it is ready and agrees with the others on a
// leader. That needs a quorum of members running with it; ctx bounds the wait.
// On error the member is left stopped.
func (c *Cluster) RestartMember(ctx context.Context, i int) error {
	c.mu.Lock()
	defer c.mu.Unlock()
	m, err := c.member(i)
	if err != nil {
		return err
	}
	if m.etcd != nil {
		return fmt.Errorf("etcdtest: %s is running", m.name)
	}
	if err := c.start(m, "existing"); err != nil {
		return err
	}
	ctx, cancel := withDefaultTimeout(ctx)
	defer cancel()
	if err := m.waitReady(ctx); err != nil {
		m.stop()
		return err
	}
	if err := c.waitLeader(ctx); err != nil {
		m.stop()
		return err
	}
	return nil
}

// RestartMembers starts the stopped members given (all stopped ones if none
// is) at once, as after an outage of a quorum or of the whole cluster, and
// waits until they are ready and agree on a leader. On error the members
// it started are left stopped.
func (c *Cluster) RestartMembers(ctx context.Context, idx ...int) error {
	c.mu.Lock()
	defer c.mu.Unlock()
	if len(idx) == 0 {
		for i, m := range c.members {
			if m.etcd == nil {
				idx = append(idx, i)
			}
		}
	}
	var started []*member
	stopAll := func() {
		for _, m := range started {
			m.stop()
		}
	}
	for _, i := range idx {
		m, err := c.member(i)
		if err != nil {
			stopAll()
			return err
		}
		if m.etcd != nil {
			stopAll()
			return fmt.Errorf("etcdtest: %s is running", m.name)
		}
		if err := c.start(m, "existing"); err != nil {
			stopAll()
			return err
		}
		started = append(started, m)
	}
	ctx, cancel := withDefaultTimeout(ctx)
	defer cancel()
	for _, m := range started {
		if err := m.waitReady(ctx); err != nil {
			stopAll()
			return err
		}
	}
	if err := c.waitLeader(ctx); err != nil {
		stopAll()
		return err
	}
	return nil
}

// Running returns the indexes of the running members, in order.
func (c *Cluster) Running() []int {
	c.mu.Lock()
	defer c.mu.Unlock()
	var r []int
	for i, m := range c.members {
		if m.etcd != nil {
			r = append(r, i)
		}
	}
	return r
}

// Close stops every running member; their ports are free when it returns.
func (c *Cluster) Close() error {
	c.mu.Lock()
	defer c.mu.Unlock()
	var wg sync.WaitGroup
	for _, m := range c.members {
		if m.etcd == nil {
			continue
		}
		// Stopping raft first drops the peer transports, so that a leader
		// does not try to hand leadership to members that are going away
		// too (etcd waits its request timeout, 7s here, for that).
		wg.Go(func() {
			m.etcd.Server.HardStop()
			m.stop()
		})
	}
	wg.Wait()
	return nil
}

func (c *Cluster) member(i int) (*member, error) {
	if i < 0 || i >= len(c.members) {
		return nil, fmt.Errorf("etcdtest: no member %d in %d", i, len(c.members))
	}
	return c.members[i], nil
}

// withDefaultTimeout adds readyTimeout to a ctx that has no deadline.
func withDefaultTimeout(ctx context.Context) (context.Context, context.CancelFunc) {
	if _, ok := ctx.Deadline(); ok {
		return context.WithCancel(ctx)
	}
	return context.WithTimeout(ctx, readyTimeout)
}
