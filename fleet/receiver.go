package fleet

import (
	"context"
	"crypto/tls"
	"crypto/x509"
	"errors"
	"fmt"
	"io"
	"os"
	"sync"
	"time"

	"github.com/vmsup/vmsup/fleet/peer"
)

// A drain migrates VMs between agents without ssh: each agent listens for
// the migration protocol (what `vmsup migrate-receive` speaks on stdin and
// stdout) on a TCP port with mutual TLS, and a source's transport is `vmsup
// fleet migrate-connect`, which pipes its stdin and stdout to that port.
// Both sides present certificates of the fleet's CA (by default the ones
// they use for etcd), so only fleet hosts can start a VM on a host. The
// same port answers other agents' questions (fleet/peer).

// PeerTLS is the TLS set-up between agents: certificates signed by ca,
// checked both ways. Host names are not checked (hosts are known by their
// addresses, which certificates seldom list); the chain is.
func PeerTLS(caFile, certFile, keyFile string) (server, client *tls.Config, err error) {
	pem, err := os.ReadFile(caFile)
	if err != nil {
		return nil, nil, fmt.Errorf("peer TLS: %w", err)
	}
	pool := x509.NewCertPool()
	if !pool.AppendCertsFromPEM(pem) {
		return nil, nil, fmt.Errorf("peer TLS: %s: no certificate", caFile)
	}
	cert, err := tls.LoadX509KeyPair(certFile, keyFile)
	if err != nil {
		return nil, nil, fmt.Errorf("peer TLS: %w", err)
	}
	verify := func(raw [][]byte, _ [][]*x509.Certificate) error {
		if len(raw) == 0 {
			return errors.New("no certificate")
		}
		leaf, err := x509.ParseCertificate(raw[0])
		if err != nil {
			return err
		}
		inter := x509.NewCertPool()
		for _, r := range raw[1:] {
			if c, err := x509.ParseCertificate(r); err == nil {
				inter.AddCert(c)
			}
		}
		_, err = leaf.Verify(x509.VerifyOptions{Roots: pool, Intermediates: inter, KeyUsages: []x509.ExtKeyUsage{x509.ExtKeyUsageAny}})
		return err
	}
	server = &tls.Config{Certificates: []tls.Certificate{cert}, ClientAuth: tls.RequireAnyClientCert, VerifyPeerCertificate: verify, MinVersion: tls.VersionTLS13}
	client = &tls.Config{Certificates: []tls.Certificate{cert}, InsecureSkipVerify: true, VerifyPeerCertificate: verify, MinVersion: tls.VersionTLS13} //nolint:gosec // the chain is verified above
	return server, client, nil
}

// serve takes connections on the agent's port until ctx ends: a peer's
// question (ALPN peer.Proto) gets this agent's answer, anything else is a
// migration, received by the supervisor as `vmsup migrate-receive` would.
func (a *Agent) serve(ctx context.Context) {
	tl := tls.NewListener(a.Listener, peer.ServerConfig(a.ServerTLS))
	go func() { <-ctx.Done(); tl.Close() }()
	var wg sync.WaitGroup
	defer wg.Wait()
	for {
		c, err := tl.Accept()
		if err != nil {
			if ctx.Err() == nil {
				a.Log.Error("agent port", "err", err)
			}
			return
		}
		wg.Go(func() {
			defer c.Close()
			tc := c.(*tls.Conn)
			hctx, cancel := context.WithTimeout(ctx, handshakeTimeout)
			err := tc.HandshakeContext(hctx)
			cancel()
			switch {
			case err != nil:
				a.Log.Warn("agent port: handshake", "from", c.RemoteAddr(), "err", err)
			case peer.IsQuestion(tc):
				c.SetWriteDeadline(time.Now().Add(handshakeTimeout))
				peer.Respond(c, a.answer(ctx))
			default:
				if err := a.Sup.Receive(ctx, c, c); err != nil {
					a.Log.Warn("incoming migration", "from", c.RemoteAddr(), "err", err)
				}
			}
		})
	}
}

// handshakeTimeout bounds a connection's TLS handshake and a question's
// answer: a client that stalls must not hold a goroutine for long.
const handshakeTimeout = 5 * time.Second

// Connect pipes r and w to the agent's migration port at addr (the source
// side's transport).
func Connect(ctx context.Context, addr string, conf *tls.Config, r io.Reader, w io.Writer) error {
	d := tls.Dialer{Config: conf}
	c, err := d.DialContext(ctx, "tcp", addr)
	if err != nil {
		return fmt.Errorf("migrate-connect %s: %w", addr, err)
	}
	defer c.Close()
	done := make(chan error, 1)
	go func() {
		_, err := io.Copy(c, r)
		c.(*tls.Conn).CloseWrite()
		done <- err
	}()
	_, err = io.Copy(w, c)
	return err
}
