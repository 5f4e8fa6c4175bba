// Package client is the Go client of vmsup's remote API (package
// remoteapi): a Client implements remoteapi.Ops, the operations the CLI
// calls, so `vmsup --remote URL ...` runs the same command code against a
// remote host. It owns the transport (mutual TLS, or a unix socket) and the
// wire; what an answer means is the supervisor's types.
package client

import (
	"bufio"
	"bytes"
	"context"
	"crypto/tls"
	"crypto/x509"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"net/url"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"time"

	"github.com/vmsup/vmsup/remoteapi"
	"github.com/vmsup/vmsup/spec"
)

// Options say where the server is and who the client is.
type Options struct {
	// URL is "https://HOST:PORT" (mutual TLS) or "unix:///PATH" (the local
	// socket; the server knows the caller by its user).
	URL string
	// CA, Cert and Key are PEM files: the CA the server's certificate
	// must be signed by, and the client's certificate and key (https).
	CA, Cert, Key string
	// Timeout bounds a call that does not stream (0: 15 minutes).
	Timeout time.Duration
}

// Client calls one server.
type Client struct {
	base    string
	http    *http.Client
	timeout time.Duration

	mu      sync.Mutex
	applied map[*spec.File]bool // files AppliedSpec returned: restart them by name
}

// New makes a client; it connects at its first call.
func New(o Options) (*Client, error) {
	u, err := url.Parse(o.URL)
	if err != nil {
		return nil, fmt.Errorf("--remote %q: %w", o.URL, err)
	}
	tr := &http.Transport{TLSHandshakeTimeout: 10 * time.Second, IdleConnTimeout: 20 * time.Second, MaxIdleConnsPerHost: 4}
	c := &Client{http: &http.Client{Transport: tr}, timeout: o.Timeout, applied: map[*spec.File]bool{}}
	if c.timeout == 0 {
		c.timeout = 15 * time.Minute
	}
	switch u.Scheme {
	case "https":
		if o.CA == "" || o.Cert == "" || o.Key == "" {
			return nil, fmt.Errorf("--remote %s: --ca, --cert and --key are needed (mutual TLS)", o.URL)
		}
		conf, err := tlsConfig(o)
		if err != nil {
			return nil, err
		}
		tr.TLSClientConfig = conf
		c.base = "https://" + u.Host
	case "unix":
		sock := u.Path
		d := net.Dialer{Timeout: 10 * time.Second}
		tr.DialContext = func(ctx context.Context, _, _ string) (net.Conn, error) { return d.DialContext(ctx, "unix", sock) }
		c.base = "http://vmsup"
	default:
		return nil, fmt.Errorf("--remote %q: want https://HOST:PORT or unix:///PATH", o.URL)
	}
	return c, nil
}

func tlsConfig(o Options) (*tls.Config, error) {
	cert, err := tls.LoadX509KeyPair(o.Cert, o.Key)
	if err != nil {
		return nil, fmt.Errorf("--cert %s / --key %s: %w", o.Cert, o.Key, err)
	}
	pem, err := os.ReadFile(o.CA)
	if err != nil {
		return nil, fmt.Errorf("--ca: %w", err)
	}
	pool := x509.NewCertPool()
	if !pool.AppendCertsFromPEM(pem) {
		return nil, fmt.Errorf("--ca %s: no PEM certificate in it", o.CA)
	}
	return &tls.Config{Certificates: []tls.Certificate{cert}, RootCAs: pool, MinVersion: tls.VersionTLS13}, nil
}

// Close drops the client's idle connections.
func (c *Client) Close() error {
	c.http.CloseIdleConnections()
	return nil
}

// do sends a request and returns the response of a 2xx answer; any other
// answer is its *remoteapi.Error.
func (c *Client) do(ctx context.Context, method, path string, q url.Values, body any) (*http.Response, error) {
	var rd io.Reader
	if body != nil {
		b, err := json.Marshal(body)
		if err != nil {
			return nil, err
		}
		rd = bytes.NewReader(b)
	}
	u := c.base + path
	if len(q) > 0 {
		u += "?" + q.Encode()
	}
	req, err := http.NewRequestWithContext(ctx, method, u, rd)
	if err != nil {
		return nil, err
	}
	if body != nil {
		req.Header.Set("Content-Type", "application/json")
	}
	resp, err := c.http.Do(req)
	if err != nil {
		return nil, fmt.Errorf("vmsup --remote: %w", err)
	}
	if resp.StatusCode/100 != 2 && resp.Header.Get("Content-Type") != "application/json" {
		defer resp.Body.Close()
		b, _ := io.ReadAll(io.LimitReader(resp.Body, 512))
		return nil, fmt.Errorf("vmsup --remote: %s %s: %s: %s", method, path, resp.Status, strings.TrimSpace(string(b)))
	}
	return resp, nil
}

// call makes a call that answers a remoteapi.Answer and decodes its result
// into out (which may be nil); the answer's error is returned as received.
func (c *Client) call(ctx context.Context, method, path string, q url.Values, body, out any) error {
	ctx, cancel := context.WithTimeout(ctx, c.timeout)
	defer cancel()
	resp, err := c.do(ctx, method, path, q, body)
	if err != nil {
		return err
	}
	defer resp.Body.Close()
	var a remoteapi.Answer[json.RawMessage]
	if err := json.NewDecoder(resp.Body).Decode(&a); err != nil {
		return fmt.Errorf("vmsup --remote: %s %s: answer: %w", method, path, err)
	}
	if out != nil && len(a.Result) > 0 && string(a.Result) != "null" {
		if err := json.Unmarshal(a.Result, out); err != nil {
			return fmt.Errorf("vmsup --remote: %s %s: result: %w", method, path, err)
		}
	}
	if a.Error != nil {
		return a.Error
	}
	return nil
}

// lines reads a streamed answer of GET path, giving each item to fn.
func lines[T any](ctx context.Context, c *Client, path string, q url.Values, fn func(T) error) error {
	return streamed(ctx, c, http.MethodGet, path, q, nil, fn)
}

// streamed sends a request with body (nil for none) whose answer is
// streamed, giving each item to fn.
func streamed[T any](ctx context.Context, c *Client, method, path string, q url.Values, body any, fn func(T) error) error {
	resp, err := c.do(ctx, method, path, q, body)
	if err != nil {
		return err
	}
	defer resp.Body.Close()
	if resp.Header.Get("Content-Type") != "application/x-ndjson" {
		var a remoteapi.Answer[json.RawMessage]
		if err := json.NewDecoder(resp.Body).Decode(&a); err != nil || a.Error == nil {
			return fmt.Errorf("vmsup --remote: %s %s: %s without an error", method, path, resp.Status)
		}
		return a.Error
	}
	sc := bufio.NewScanner(resp.Body)
	sc.Buffer(make([]byte, 64<<10), 16<<20)
	for sc.Scan() {
		var l remoteapi.Line[T]
		if err := json.Unmarshal(sc.Bytes(), &l); err != nil {
			return fmt.Errorf("vmsup --remote: %s %s: line: %w", method, path, err)
		}
		if l.End {
			if l.Err != nil {
				return l.Err
			}
			return nil
		}
		if l.Item != nil {
			if err := fn(*l.Item); err != nil {
				return err
			}
		}
	}
	if err := sc.Err(); err != nil && ctx.Err() == nil {
		return fmt.Errorf("vmsup --remote: %s %s: %w", method, path, err)
	}
	if ctx.Err() != nil {
		return ctx.Err()
	}
	return errors.New("vmsup --remote: " + method + " " + path + ": the stream ended without its end line")
}

// file is a parsed file as submitted: its content and base name.
func file(f *spec.File) remoteapi.File {
	return remoteapi.File{Name: filepath.Base(f.Path), Content: string(f.Raw)}
}

// vm is the path of a VM's resource.
func vm(name string, rest ...string) string {
	p := "/" + remoteapi.Version + "/vms/" + url.PathEscape(name)
	for _, r := range rest {
		p += "/" + url.PathEscape(r)
	}
	return p
}
