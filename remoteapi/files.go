package remoteapi

import (
	"fmt"
	"os"
	"path/filepath"
	"strings"

	"github.com/vmsup/vmsup/internal/util/atomicfile"
	"github.com/vmsup/vmsup/spec"
)

// Files submitted by content (up, plan, apply, restart FILE) are kept in
// ROOT/remote/files as NAME.toml, the file the VM then belongs to, so
// status, plan and the file's sync state work as for a file on the host.
// They are parsed by spec.Parse as if they lay there (relative paths in them
// resolve against that directory) and the operation itself checks them
// (the supervisor's Validate: the host-path allow-list and more), exactly
// as it checks a local file: nothing here trusts or re-checks them.

// filesDir is where submitted files are kept.
func (s *Server) filesDir() string { return filepath.Join(s.Root, "remote", "files") }

// parse parses a submitted file as the file of its VM in filesDir.
func (s *Server) parse(f File) (*spec.File, error) {
	base := filepath.Base(f.Name)
	if !strings.HasSuffix(base, ".toml") || base == ".toml" || strings.ContainsAny(base, "/\x00") {
		base = "submitted.toml"
	}
	p, err := spec.Parse(filepath.Join(s.filesDir(), base), []byte(f.Content))
	if err != nil {
		return nil, err
	}
	if want := p.VM.Name + ".toml"; want != base {
		return spec.Parse(filepath.Join(s.filesDir(), want), []byte(f.Content))
	}
	return p, nil
}

// keep writes a parsed submitted file where it says it lies.
func (s *Server) keep(f *spec.File) error {
	if err := os.MkdirAll(s.filesDir(), 0o700); err != nil {
		return err
	}
	if err := atomicfile.WriteFile(f.Path, f.Raw, 0o600); err != nil {
		return fmt.Errorf("keep %s: %w", f.Path, err)
	}
	return nil
}
