package migwire

import (
	"context"
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/rand"
	"crypto/sha256"
	"crypto/subtle"
	"crypto/tls"
	"crypto/x509"
	"crypto/x509/pkix"
	"encoding/hex"
	"errors"
	"fmt"
	"math/big"
	"net"
	"time"
)

// The migration stream between hosts carries the guest's memory: the relays
// speak TLS 1.3 to each other. No PKI is needed: the destination makes a
// key and certificate for this one migration and sends the certificate's
// SHA-256 over the transport that already authenticated both sides (ssh),
// and the source accepts exactly that certificate. The token then travels
// inside TLS.

const relayServerName = "vmsup-migration"

// TLS is the destination's side: a fresh certificate and its pin.
type TLS struct {
	config *tls.Config
	Pin    string // hex SHA-256 of the certificate (DER)
}

func NewTLS() (*TLS, error) {
	key, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		return nil, err
	}
	serial, err := rand.Int(rand.Reader, new(big.Int).Lsh(big.NewInt(1), 120))
	if err != nil {
		return nil, err
	}
	now := time.Now()
	tmpl := &x509.Certificate{
		SerialNumber: serial,
		Subject:      pkix.Name{CommonName: relayServerName},
		DNSNames:     []string{relayServerName},
		NotBefore:    now.Add(-time.Hour),
		NotAfter:     now.Add(24 * time.Hour),
		KeyUsage:     x509.KeyUsageDigitalSignature,
		ExtKeyUsage:  []x509.ExtKeyUsage{x509.ExtKeyUsageServerAuth},
	}
	der, err := x509.CreateCertificate(rand.Reader, tmpl, tmpl, &key.PublicKey, key)
	if err != nil {
		return nil, err
	}
	sum := sha256.Sum256(der)
	return &TLS{
		config: &tls.Config{
			MinVersion:   tls.VersionTLS13,
			Certificates: []tls.Certificate{{Certificate: [][]byte{der}, PrivateKey: key}},
		},
		Pin: hex.EncodeToString(sum[:]),
	}, nil
}

// listen wraps the destination's TCP listener.
func (t *TLS) Listen(ln net.Listener) net.Listener { return tls.NewListener(ln, t.config) }

// DialTLS is the source's side: TLS over a connection from dial,
// accepting only the certificate whose SHA-256 is pin.
func DialTLS(ctx context.Context, conn net.Conn, pin string) (net.Conn, error) {
	want, err := hex.DecodeString(pin)
	if err != nil || len(want) != sha256.Size {
		conn.Close()
		return nil, fmt.Errorf("destination sent no valid certificate pin %q", pin)
	}
	c := tls.Client(conn, &tls.Config{
		MinVersion: tls.VersionTLS13,
		ServerName: relayServerName,
		// Verified below against the pin, not against a CA.
		InsecureSkipVerify: true,
		VerifyPeerCertificate: func(raw [][]byte, _ [][]*x509.Certificate) error {
			if len(raw) == 0 {
				return errors.New("no certificate")
			}
			got := sha256.Sum256(raw[0])
			if subtle.ConstantTimeCompare(got[:], want) != 1 {
				return errors.New("the destination's certificate is not the one it announced over the transport")
			}
			return nil
		},
	})
	if err := c.HandshakeContext(ctx); err != nil {
		c.Close()
		return nil, fmt.Errorf("TLS to the destination's relay: %w", err)
	}
	return c, nil
}
