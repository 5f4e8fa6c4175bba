package peer_test

import (
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/rand"
	"crypto/tls"
	"crypto/x509"
	"crypto/x509/pkix"
	"encoding/pem"
	"io"
	"math/big"
	"net"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/vmsup/vmsup/fleet"
	"github.com/vmsup/vmsup/fleet/peer"
)

// TestQuestion: on one port with the fleet's mutual TLS, a connection that
// offers the peer protocol gets the answer, one that does not (a
// migration's) is told apart; a dead address is an error; a client
// without a fleet certificate gets nothing.
func TestQuestion(t *testing.T) {
	srvConf, cliConf := fleetTLS(t, t.TempDir())
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	tl := tls.NewListener(l, peer.ServerConfig(srvConf))
	t.Cleanup(func() { tl.Close() })
	until := time.Now().Add(10 * time.Second).UTC().Round(time.Millisecond)
	go func() {
		for {
			c, err := tl.Accept()
			if err != nil {
				return
			}
			go func() {
				defer c.Close()
				tc := c.(*tls.Conn)
				if tc.Handshake() != nil {
					return
				}
				if peer.IsQuestion(tc) {
					peer.Respond(c, peer.Answer{Host: "h2", Etcd: peer.Unreachable, HoldUntil: until})
					return
				}
				io.WriteString(c, "migration\n")
			}()
		}
	}()
	addr := l.Addr().String()
	ctx := t.Context()
	a, err := peer.Ask(ctx, peer.ClientConfig(cliConf), addr)
	if err != nil || a.Host != "h2" || a.Etcd != peer.Unreachable || !a.HoldUntil.Equal(until) {
		t.Fatalf("answer %+v, %v; want h2 unreachable, hold until %s", a, err, until)
	}
	c, err := tls.Dial("tcp", addr, cliConf) // no ALPN: a migration
	if err != nil {
		t.Fatal(err)
	}
	b, _ := io.ReadAll(c)
	c.Close()
	if string(b) != "migration\n" {
		t.Errorf("a connection without the peer protocol got %q; want the migration side", b)
	}
	dead, _ := net.Listen("tcp", "127.0.0.1:0")
	deadAddr := dead.Addr().String()
	dead.Close()
	answers, errs := peer.AskAll(ctx, peer.ClientConfig(cliConf), map[string]string{"h2": addr, "h3": deadAddr}, time.Second)
	if len(answers) != 1 || answers["h2"].Etcd != peer.Unreachable || errs["h3"] == nil {
		t.Errorf("AskAll: %+v %v; want h2's answer and h3's error", answers, errs)
	}
	_, strangerConf := fleetTLS(t, t.TempDir()) // another CA
	if a, err := peer.Ask(ctx, peer.ClientConfig(strangerConf), addr); err == nil {
		t.Errorf("a client of another CA got an answer: %+v", a)
	}
}

func TestReachText(t *testing.T) {
	for _, r := range []peer.Reach{peer.Unknown, peer.Reachable, peer.Leaderless, peer.Unreachable} {
		b, _ := r.MarshalText()
		var back peer.Reach
		back.UnmarshalText(b)
		if back != r {
			t.Errorf("%v -> %q -> %v", r, b, back)
		}
	}
	var r peer.Reach = peer.Reachable
	r.UnmarshalText([]byte("from-the-future"))
	if r != peer.Unknown || !strings.HasPrefix(peer.Reach(9).String(), "Reach(") {
		t.Errorf("an unknown name reads as %v", r)
	}
}

// fleetTLS makes a CA and a certificate it signed in dir and returns the
// fleet's TLS set-up on them (fleet.PeerTLS, as the agent builds it).
func fleetTLS(t *testing.T, dir string) (server, client *tls.Config) {
	t.Helper()
	caKey, _ := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	ca := &x509.Certificate{SerialNumber: big.NewInt(1), Subject: pkix.Name{CommonName: "fleet CA"}, IsCA: true,
		BasicConstraintsValid: true, KeyUsage: x509.KeyUsageCertSign, NotBefore: time.Now().Add(-time.Hour), NotAfter: time.Now().Add(time.Hour)}
	caDER, err := x509.CreateCertificate(rand.Reader, ca, ca, &caKey.PublicKey, caKey)
	if err != nil {
		t.Fatal(err)
	}
	ca, _ = x509.ParseCertificate(caDER)
	key, _ := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	leaf := &x509.Certificate{SerialNumber: big.NewInt(2), Subject: pkix.Name{CommonName: "host"},
		ExtKeyUsage: []x509.ExtKeyUsage{x509.ExtKeyUsageServerAuth, x509.ExtKeyUsageClientAuth},
		KeyUsage:    x509.KeyUsageDigitalSignature, NotBefore: time.Now().Add(-time.Hour), NotAfter: time.Now().Add(time.Hour)}
	leafDER, err := x509.CreateCertificate(rand.Reader, leaf, ca, &key.PublicKey, caKey)
	if err != nil {
		t.Fatal(err)
	}
	keyDER, _ := x509.MarshalECPrivateKey(key)
	write := func(name, typ string, der []byte) string {
		p := filepath.Join(dir, name)
		if err := os.WriteFile(p, pem.EncodeToMemory(&pem.Block{Type: typ, Bytes: der}), 0o600); err != nil {
			t.Fatal(err)
		}
		return p
	}
	server, client, err = fleet.PeerTLS(write("ca.pem", "CERTIFICATE", caDER), write("cert.pem", "CERTIFICATE", leafDER), write("key.pem", "EC PRIVATE KEY", keyDER))
	if err != nil {
		t.Fatal(err)
	}
	return server, client
}
