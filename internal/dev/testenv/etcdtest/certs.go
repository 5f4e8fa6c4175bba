package etcdtest

import (
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/rand"
	"crypto/x509"
	"crypto/x509/pkix"
	"encoding/pem"
	"fmt"
	"math/big"
	"net"
	"os"
	"path/filepath"
	"time"
)

// tlsFiles are the PEM files writeCerts leaves in the cluster directory.
type tlsFiles struct {
	ca                    string // the throwaway CA both sides trust
	serverCert, serverKey string
	clientCert, clientKey string
}

// writeCerts makes a throwaway ECDSA CA, a server certificate for ip,
// 127.0.0.1 and localhost, and a client certificate, and writes them as PEM
// files into dir.
func writeCerts(dir string, ip net.IP) (tlsFiles, error) {
	f := tlsFiles{
		ca:         filepath.Join(dir, "ca.pem"),
		serverCert: filepath.Join(dir, "server.pem"),
		serverKey:  filepath.Join(dir, "server-key.pem"),
		clientCert: filepath.Join(dir, "client.pem"),
		clientKey:  filepath.Join(dir, "client-key.pem"),
	}
	now := time.Now()
	caKey, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		return f, err
	}
	caTmpl := &x509.Certificate{
		Subject:               pkix.Name{CommonName: "etcdtest CA"},
		NotBefore:             now.Add(-time.Hour), // tolerate a skewed clock
		NotAfter:              now.Add(30 * 24 * time.Hour),
		KeyUsage:              x509.KeyUsageCertSign | x509.KeyUsageCRLSign | x509.KeyUsageDigitalSignature,
		BasicConstraintsValid: true,
		IsCA:                  true,
	}
	caDER, err := sign(caTmpl, caTmpl, &caKey.PublicKey, caKey)
	if err != nil {
		return f, err
	}
	ca, err := x509.ParseCertificate(caDER)
	if err != nil {
		return f, err
	}
	if err := writePEM(f.ca, "CERTIFICATE", caDER, 0o644); err != nil {
		return f, err
	}

	ips := []net.IP{ip}
	if !ip.Equal(net.IPv4(127, 0, 0, 1)) {
		ips = append(ips, net.IPv4(127, 0, 0, 1))
	}
	server := &x509.Certificate{
		Subject:     pkix.Name{CommonName: "etcdtest server"},
		NotBefore:   caTmpl.NotBefore,
		NotAfter:    caTmpl.NotAfter,
		KeyUsage:    x509.KeyUsageDigitalSignature,
		IPAddresses: ips,
		DNSNames:    []string{"localhost"},
		// ClientAuth too: etcd's grpc-gateway dials its own gRPC port
		// presenting the server certificate as its client certificate.
		ExtKeyUsage: []x509.ExtKeyUsage{x509.ExtKeyUsageServerAuth, x509.ExtKeyUsageClientAuth},
	}
	if err := writeLeaf(server, ca, caKey, f.serverCert, f.serverKey); err != nil {
		return f, err
	}
	// No SANs: etcd checks a client certificate's SANs against the
	// connection's remote address when there are any, and clients in
	// namespaces connect from addresses not known here.
	client := &x509.Certificate{
		Subject:     pkix.Name{CommonName: "etcdtest client"},
		NotBefore:   caTmpl.NotBefore,
		NotAfter:    caTmpl.NotAfter,
		KeyUsage:    x509.KeyUsageDigitalSignature,
		ExtKeyUsage: []x509.ExtKeyUsage{x509.ExtKeyUsageClientAuth},
	}
	if err := writeLeaf(client, ca, caKey, f.clientCert, f.clientKey); err != nil {
		return f, err
	}
	return f, nil
}

// writeLeaf makes a key for tmpl, has ca sign it and writes both as PEM.
func writeLeaf(tmpl, ca *x509.Certificate, caKey *ecdsa.PrivateKey, certFile, keyFile string) error {
	key, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		return err
	}
	der, err := sign(tmpl, ca, &key.PublicKey, caKey)
	if err != nil {
		return err
	}
	keyDER, err := x509.MarshalPKCS8PrivateKey(key)
	if err != nil {
		return err
	}
	if err := writePEM(certFile, "CERTIFICATE", der, 0o644); err != nil {
		return err
	}
	return writePEM(keyFile, "PRIVATE KEY", keyDER, 0o600)
}

// sign gives tmpl a random serial number and signs it with parent's key.
func sign(tmpl, parent *x509.Certificate, pub *ecdsa.PublicKey, signer *ecdsa.PrivateKey) ([]byte, error) {
	serial, err := rand.Int(rand.Reader, new(big.Int).Lsh(big.NewInt(1), 127))
	if err != nil {
		return nil, err
	}
	tmpl.SerialNumber = serial
	der, err := x509.CreateCertificate(rand.Reader, tmpl, parent, pub, signer)
	if err != nil {
		return nil, fmt.Errorf("certificate %q: %w", tmpl.Subject.CommonName, err)
	}
	return der, nil
}

func writePEM(path, typ string, der []byte, mode os.FileMode) error {
	return os.WriteFile(path, pem.EncodeToMemory(&pem.Block{Type: typ, Bytes: der}), mode)
}
