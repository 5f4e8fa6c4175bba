// Package enrol sets the remote API up without hand-made certificates:
// a CA and the server's certificate kept under the state root (made on
// first use), client certificates issued with a grant and handed over as
// one bundle, and, on the client, the remotes a bundle was added as.
package enrol

import (
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/rand"
	"crypto/tls"
	"crypto/x509"
	"crypto/x509/pkix"
	"encoding/pem"
	"errors"
	"fmt"
	"io/fs"
	"math/big"
	"net"
	"os"
	"path/filepath"
	"time"

	"github.com/vmsup/vmsup/internal/util/atomicfile"
)

// Lifetimes of what the PKI issues.
const (
	caLifetime     = 10 * 365 * 24 * time.Hour
	serverLifetime = 2 * 365 * 24 * time.Hour
	clientLifetime = 365 * 24 * time.Hour
)

// PKI is the API's CA and server certificate, PEM files in Dir
// (ROOT/remote/pki): ca.pem, ca-key.pem, server.pem, server-key.pem. Keys
// are 0600, the directory 0700.
type PKI struct {
	Dir   string
	ca    *x509.Certificate
	caKey *ecdsa.PrivateKey
}

// Paths of the PKI's files.
func (p *PKI) CAFile() string        { return filepath.Join(p.Dir, "ca.pem") }
func (p *PKI) CAKeyFile() string     { return filepath.Join(p.Dir, "ca-key.pem") }
func (p *PKI) ServerFile() string    { return filepath.Join(p.Dir, "server.pem") }
func (p *PKI) ServerKeyFile() string { return filepath.Join(p.Dir, "server-key.pem") }

// EnsurePKI opens the PKI in dir, making the CA and a server certificate
// for names (host names and IP addresses) if they are not there yet. An
// existing server certificate is kept as it is: clients already trust it.
func EnsurePKI(dir string, names []string) (*PKI, error) {
	if err := os.MkdirAll(dir, 0o700); err != nil {
		return nil, err
	}
	p := &PKI{Dir: dir}
	if _, err := os.Stat(p.CAFile()); errors.Is(err, fs.ErrNotExist) {
		if err := p.makeCA(); err != nil {
			return nil, err
		}
	}
	if err := p.load(); err != nil {
		return nil, err
	}
	if _, err := os.Stat(p.ServerFile()); errors.Is(err, fs.ErrNotExist) {
		cert, key, err := p.issue("vmsup-api", names, x509.ExtKeyUsageServerAuth, serverLifetime)
		if err != nil {
			return nil, err
		}
		if err := writeKeyPair(p.ServerFile(), p.ServerKeyFile(), cert, key); err != nil {
			return nil, err
		}
	}
	return p, nil
}

// OpenPKI opens the PKI that EnsurePKI made in dir.
func OpenPKI(dir string) (*PKI, error) {
	p := &PKI{Dir: dir}
	if err := p.load(); err != nil {
		if errors.Is(err, fs.ErrNotExist) {
			return nil, fmt.Errorf("%s: no API CA here: run vmsup api install first (with the same --root)", dir)
		}
		return nil, err
	}
	return p, nil
}

func (p *PKI) makeCA() error {
	key, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		return err
	}
	host, _ := os.Hostname()
	tmpl := &x509.Certificate{SerialNumber: serial(), Subject: pkix.Name{CommonName: "vmsup API CA " + host},
		NotBefore: time.Now().Add(-time.Hour), NotAfter: time.Now().Add(caLifetime),
		IsCA: true, BasicConstraintsValid: true, MaxPathLenZero: true, KeyUsage: x509.KeyUsageCertSign | x509.KeyUsageDigitalSignature}
	der, err := x509.CreateCertificate(rand.Reader, tmpl, tmpl, &key.PublicKey, key)
	if err != nil {
		return err
	}
	// The key first: a CA certificate without its key would block EnsurePKI.
	kder, err := x509.MarshalECPrivateKey(key)
	if err != nil {
		return err
	}
	return writeKeyPair(p.CAFile(), p.CAKeyFile(), pemBlock("CERTIFICATE", der), pemBlock("EC PRIVATE KEY", kder))
}

func (p *PKI) load() error {
	pair, err := tls.LoadX509KeyPair(p.CAFile(), p.CAKeyFile())
	if err != nil {
		return err
	}
	key, ok := pair.PrivateKey.(*ecdsa.PrivateKey)
	if !ok {
		return fmt.Errorf("%s: not an ECDSA key", p.CAKeyFile())
	}
	if p.ca, err = x509.ParseCertificate(pair.Certificate[0]); err != nil {
		return fmt.Errorf("%s: %w", p.CAFile(), err)
	}
	p.caKey = key
	return nil
}

// IssueClient makes a client certificate for common name cn (the identity
// "cn:CN" of the server's grants) and returns it and its key as PEM.
func (p *PKI) IssueClient(cn string) (cert, key []byte, err error) {
	return p.issue(cn, nil, x509.ExtKeyUsageClientAuth, clientLifetime)
}

// issue makes a certificate the CA signs, for a server's names (IP
// addresses or DNS names) or a client.
func (p *PKI) issue(cn string, names []string, use x509.ExtKeyUsage, life time.Duration) (cert, key []byte, err error) {
	k, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		return nil, nil, err
	}
	tmpl := &x509.Certificate{SerialNumber: serial(), Subject: pkix.Name{CommonName: cn},
		NotBefore: time.Now().Add(-time.Hour), NotAfter: time.Now().Add(life),
		KeyUsage: x509.KeyUsageDigitalSignature, ExtKeyUsage: []x509.ExtKeyUsage{use}}
	for _, n := range names {
		if ip := net.ParseIP(n); ip != nil {
			tmpl.IPAddresses = append(tmpl.IPAddresses, ip)
		} else if n != "" {
			tmpl.DNSNames = append(tmpl.DNSNames, n)
		}
	}
	der, err := x509.CreateCertificate(rand.Reader, tmpl, p.ca, &k.PublicKey, p.caKey)
	if err != nil {
		return nil, nil, err
	}
	kder, err := x509.MarshalECPrivateKey(k)
	if err != nil {
		return nil, nil, err
	}
	return pemBlock("CERTIFICATE", der), pemBlock("EC PRIVATE KEY", kder), nil
}

// CAPEM is the CA's certificate.
func (p *PKI) CAPEM() []byte { return pemBlock("CERTIFICATE", p.ca.Raw) }

func serial() *big.Int {
	n, _ := rand.Int(rand.Reader, new(big.Int).Lsh(big.NewInt(1), 126))
	return n
}

func pemBlock(typ string, der []byte) []byte {
	return pem.EncodeToMemory(&pem.Block{Type: typ, Bytes: der})
}

// writeKeyPair writes the key (0600) before the certificate, each whole or
// not at all: a certificate on disk always has its key.
func writeKeyPair(certFile, keyFile string, cert, key []byte) error {
	if err := atomicfile.WriteFile(keyFile, key, 0o600); err != nil {
		return fmt.Errorf("write %s: %w", keyFile, err)
	}
	if err := atomicfile.WriteFile(certFile, cert, 0o644); err != nil {
		return fmt.Errorf("write %s: %w", certFile, err)
	}
	return nil
}
