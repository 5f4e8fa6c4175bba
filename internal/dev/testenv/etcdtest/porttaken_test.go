package etcdtest

import (
	"errors"
	"net"
	"net/url"
	"path/filepath"
	"strconv"
	"syscall"
	"testing"
	"time"
)

// TestPortTakenIsAddrInUse: a member whose port another listener took
// fails with an error Start can tell apart (EADDRINUSE) and answers by
// starting on other ports, not a failure like any other.
func TestPortTakenIsAddrInUse(t *testing.T) {
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer l.Close()
	ports, err := pickPorts("127.0.0.1", 1)
	if err != nil {
		t.Fatal(err)
	}
	dir := t.TempDir()
	c := &Cluster{Dir: dir, opts: Options{Members: 1, IP: "127.0.0.1", ElectionTimeout: time.Second, HeartbeatInterval: 100 * time.Millisecond}}
	m := &member{name: "m0", dataDir: filepath.Join(dir, "m0"), logFile: filepath.Join(dir, "m0.log"),
		clientURL: url.URL{Scheme: "http", Host: l.Addr().String()},
		peerURL:   url.URL{Scheme: "http", Host: net.JoinHostPort("127.0.0.1", strconv.Itoa(ports[0]))}}
	c.initialCluster = "m0=" + m.peerURL.String()
	err = c.start(m, "new")
	if err == nil {
		m.stop()
		t.Fatal("a member started on a port another listener holds")
	}
	if !errors.Is(err, syscall.EADDRINUSE) {
		t.Fatalf("start on a taken port: %v, want an EADDRINUSE error", err)
	}
}
