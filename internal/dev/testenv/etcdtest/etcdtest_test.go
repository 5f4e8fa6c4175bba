package etcdtest

import (
	"context"
	"crypto/tls"
	"net"
	"slices"
	"strings"
	"testing"
	"time"

	clientv3 "go.etcd.io/etcd/client/v3"
	"go.uber.org/zap"
)

// TestCluster walks a TLS cluster through quorum loss and recovery.
func TestCluster(t *testing.T) {
	ctx := t.Context()
	start := time.Now()
	c, err := Start(ctx, t.TempDir(), Options{TLS: true})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { c.Close() })
	t.Logf("3 members ready in %v: %v", time.Since(start).Round(time.Millisecond), c.Endpoints())
	if got := c.Running(); !slices.Equal(got, []int{0, 1, 2}) {
		t.Fatalf("Running = %v", got)
	}

	cli, err := c.Client(ctx)
	if err != nil {
		t.Fatal(err)
	}
	defer cli.Close()
	put := func(key string) error {
		ctx, cancel := context.WithTimeout(ctx, 3*time.Second)
		defer cancel()
		_, err := cli.Put(ctx, key, "v-"+key)
		return err
	}
	if err := put("a"); err != nil {
		t.Fatal("put:", err)
	}
	resp, err := cli.Get(ctx, "a")
	if err != nil || len(resp.Kvs) != 1 || string(resp.Kvs[0].Value) != "v-a" {
		t.Fatalf("get a = %v, %v", resp, err)
	}

	t.Run("no client certificate", func(t *testing.T) {
		tc, err := c.tlsConfig()
		if err != nil {
			t.Fatal(err)
		}
		tc.Certificates = nil
		anon, err := clientv3.New(clientv3.Config{
			Endpoints: c.Endpoints(), TLS: tc, DialTimeout: 2 * time.Second, Logger: zap.NewNop(),
		})
		if err != nil {
			t.Fatal(err) // New does not connect, so it should not fail
		}
		defer anon.Close()
		// The raw handshake says why: the server wants a certificate.
		conn, err := tls.Dial("tcp", c.members[0].clientURL.Host, tc)
		if err == nil {
			_ = conn.SetReadDeadline(time.Now().Add(3 * time.Second))
			_, err = conn.Read(make([]byte, 1))
			conn.Close()
		}
		if err == nil || !strings.Contains(err.Error(), "certificate required") {
			t.Errorf("TLS without a client certificate: %v, want a certificate required alert", err)
		}
		tctx, cancel := context.WithTimeout(ctx, 3*time.Second)
		defer cancel()
		if _, err := anon.Put(tctx, "anon", "x"); err == nil {
			t.Fatal("put without a client certificate succeeded")
		} else {
			t.Logf("refused as expected: %v", err)
		}
	})

	if err := c.StopMember(0); err != nil {
		t.Fatal(err)
	}
	if err := put("b"); err != nil {
		t.Fatal("put with m0 stopped:", err)
	}

	if err := c.StopMember(1); err != nil {
		t.Fatal(err)
	}
	if got := c.Running(); !slices.Equal(got, []int{2}) {
		t.Fatalf("Running = %v", got)
	}
	if err := put("c"); err == nil {
		t.Fatal("put without quorum succeeded")
	} else {
		t.Logf("no quorum, as expected: %v", err)
	}
	gctx, cancel := context.WithTimeout(ctx, 3*time.Second)
	resp, err = cli.Get(gctx, "b", clientv3.WithSerializable())
	cancel()
	if err != nil || len(resp.Kvs) != 1 || string(resp.Kvs[0].Value) != "v-b" {
		t.Fatalf("serializable get b from m2 = %v, %v", resp, err)
	}

	if err := c.RestartMember(ctx, 1); err != nil {
		t.Fatal(err)
	}
	if err := put("d"); err != nil {
		t.Fatal("put after restarting m1:", err)
	}
	if err := c.RestartMember(ctx, 1); err == nil {
		t.Fatal("restarting a running member succeeded")
	}

	if err := c.Close(); err != nil {
		t.Fatal(err)
	}
	if got := c.Running(); len(got) != 0 {
		t.Fatalf("Running after Close = %v", got)
	}
	// Every port is free again: nothing of the members still listens.
	for _, m := range c.members {
		for _, u := range []string{m.clientURL.Host, m.peerURL.Host} {
			l, err := net.Listen("tcp", u)
			if err != nil {
				t.Errorf("after Close: %v", err)
				continue
			}
			l.Close()
		}
	}
}

// TestPlain checks a one-member cluster without TLS, on defaults otherwise.
func TestPlain(t *testing.T) {
	ctx := t.Context()
	c, err := Start(ctx, t.TempDir(), Options{Members: 1})
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	if c.CAFile != "" || c.Endpoints()[0][:7] != "http://" {
		t.Fatalf("plain cluster: CA %q, endpoints %v", c.CAFile, c.Endpoints())
	}
	cli, err := c.Client(ctx)
	if err != nil {
		t.Fatal(err)
	}
	defer cli.Close()
	if _, err := cli.Put(ctx, "k", "v"); err != nil {
		t.Fatal(err)
	}
}
