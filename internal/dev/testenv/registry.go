package testenv

import (
	"bytes"
	"context"
	"fmt"
	"net"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"time"
)

// Registry is a real OCI distribution registry: Debian's docker-registry,
// on a free loopback port, with its own configuration and storage under
// the directory given to StartRegistry. Stop it after.
type Registry struct {
	Addr    string // "127.0.0.1:PORT"
	Storage string // its filesystem storage's root
	cmd     *exec.Cmd
	exited  chan struct{}
	log     *bytes.Buffer
}

// StartRegistry starts docker-registry in dir. It fails with the reason
// when the package is missing (scripts/install-deps.sh installs it).
func StartRegistry(ctx context.Context, dir string) (*Registry, error) {
	bin, err := exec.LookPath("docker-registry")
	if err != nil {
		return nil, fmt.Errorf("testenv: docker-registry not found (apt-get install docker-registry): %w", err)
	}
	port, err := freePort()
	if err != nil {
		return nil, err
	}
	r := &Registry{Addr: net.JoinHostPort("127.0.0.1", strconv.Itoa(port)), Storage: filepath.Join(dir, "storage"),
		exited: make(chan struct{}), log: &bytes.Buffer{}}
	conf := filepath.Join(dir, "config.yml")
	body := fmt.Sprintf("version: 0.1\nlog:\n  level: warn\nstorage:\n  filesystem:\n    rootdirectory: %s\n  delete:\n    enabled: true\nhttp:\n  addr: %s\n",
		r.Storage, r.Addr)
	if err := os.MkdirAll(r.Storage, 0o700); err != nil {
		return nil, err
	}
	if err := os.WriteFile(conf, []byte(body), 0o600); err != nil {
		return nil, err
	}
	r.cmd = exec.Command(bin, "serve", conf)
	r.cmd.Dir = dir
	r.cmd.Stdout, r.cmd.Stderr = r.log, r.log
	if err := r.cmd.Start(); err != nil {
		return nil, fmt.Errorf("testenv: start docker-registry: %w", err)
	}
	go func() { r.cmd.Wait(); close(r.exited) }()
	for {
		resp, err := http.Get("http://" + r.Addr + "/v2/")
		if err == nil {
			resp.Body.Close()
			if resp.StatusCode == http.StatusOK {
				return r, nil
			}
		}
		select {
		case <-r.exited:
			return nil, fmt.Errorf("testenv: docker-registry exited: %s", strings.TrimSpace(r.log.String()))
		case <-ctx.Done():
			r.Stop()
			return nil, fmt.Errorf("testenv: docker-registry not answering on %s: %w", r.Addr, ctx.Err())
		case <-time.After(50 * time.Millisecond):
		}
	}
}

// Blob is where the registry keeps the blob of digest ("sha256:HEX").
func (r *Registry) Blob(digest string) string {
	hex := strings.TrimPrefix(digest, "sha256:")
	return filepath.Join(r.Storage, "docker", "registry", "v2", "blobs", "sha256", hex[:2], hex, "data")
}

// Stop ends the registry (the process StartRegistry started).
func (r *Registry) Stop() error {
	if r == nil || r.cmd == nil || r.cmd.Process == nil {
		return nil
	}
	select {
	case <-r.exited:
		return nil
	default:
	}
	r.cmd.Process.Kill()
	<-r.exited
	return nil
}
