package enrol

import (
	"bytes"
	"crypto/tls"
	"crypto/x509"
	"encoding/json"
	"encoding/pem"
	"fmt"
	"net/url"
)

// Bundle is what a client needs to call the API: the server's URL, the CA
// the server's certificate is signed by, and the client's certificate and
// key (PEM). `vmsup api cert` prints one; `vmsup remote add` stores it. It
// carries a private key: whoever holds it is that client.
type Bundle struct {
	Name string `json:"name"` // the client's identity: cn:NAME
	URL  string `json:"url"`
	CA   string `json:"ca"`
	Cert string `json:"cert"`
	Key  string `json:"key"`
}

// ParseBundle reads a bundle and checks it: a URL (when given), a key that
// is the certificate's, a certificate the CA signed.
func ParseBundle(data []byte) (*Bundle, error) {
	var b Bundle
	dec := json.NewDecoder(bytes.NewReader(data))
	dec.DisallowUnknownFields()
	if err := dec.Decode(&b); err != nil {
		return nil, fmt.Errorf("not a vmsup API bundle (the output of vmsup api cert): %w", err)
	}
	return &b, b.check()
}

func (b *Bundle) check() error {
	if b.URL != "" {
		if u, err := url.Parse(b.URL); err != nil || u.Scheme != "https" || u.Host == "" {
			return fmt.Errorf("url: %q: want https://HOST:PORT", b.URL)
		}
	}
	pair, err := tls.X509KeyPair([]byte(b.Cert), []byte(b.Key))
	if err != nil {
		return fmt.Errorf("cert, key: %w", err)
	}
	leaf, err := x509.ParseCertificate(pair.Certificate[0])
	if err != nil {
		return fmt.Errorf("cert: %w", err)
	}
	pool := x509.NewCertPool()
	if blk, _ := pem.Decode([]byte(b.CA)); blk == nil || !pool.AppendCertsFromPEM([]byte(b.CA)) {
		return fmt.Errorf("ca: no PEM certificate")
	}
	if _, err := leaf.Verify(x509.VerifyOptions{Roots: pool, KeyUsages: []x509.ExtKeyUsage{x509.ExtKeyUsageClientAuth}}); err != nil {
		return fmt.Errorf("cert: not a client certificate of the bundle's CA: %w", err)
	}
	return nil
}

// Marshal is the bundle as the file api cert prints.
func (b *Bundle) Marshal() []byte {
	out, _ := json.MarshalIndent(b, "", "  ")
	return append(out, '\n')
}
