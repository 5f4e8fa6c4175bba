package enrol

import (
	"errors"
	"fmt"
	"io/fs"
	"os"
	"path/filepath"
	"sort"
	"strings"

	"github.com/vmsup/vmsup/internal/util/atomicfile"
	"github.com/vmsup/vmsup/spec"
)

// Remotes are the API servers a client added by name (vmsup remote add),
// each a directory DIR/NAME of PEM files and its URL: what --remote NAME
// stands for.
type Remotes struct{ Dir string }

// DefaultRemotes is the user's: $XDG_CONFIG_HOME/vmsup/remotes (or
// ~/.config/vmsup/remotes).
func DefaultRemotes() (Remotes, error) {
	d, err := os.UserConfigDir()
	if err != nil {
		return Remotes{}, err
	}
	return Remotes{Dir: filepath.Join(d, "vmsup", "remotes")}, nil
}

// Remote is a stored remote: its URL and the files a client call uses.
type Remote struct {
	Name, URL, CA, Cert, Key string
}

func (r Remotes) files(name string) Remote {
	d := filepath.Join(r.Dir, name)
	return Remote{Name: name, CA: filepath.Join(d, "ca.pem"), Cert: filepath.Join(d, "cert.pem"), Key: filepath.Join(d, "key.pem")}
}

// Add stores b as remote name (replacing one of that name).
func (r Remotes) Add(name string, b *Bundle) (Remote, error) {
	if err := spec.ValidName(name); err != nil {
		return Remote{}, fmt.Errorf("remote %q: %w", name, err)
	}
	if b.URL == "" {
		return Remote{}, fmt.Errorf("remote %q: no URL: give one (https://HOST:PORT) or use a bundle that has it", name)
	}
	rem := r.files(name)
	rem.URL = b.URL
	if err := os.MkdirAll(filepath.Dir(rem.CA), 0o700); err != nil {
		return Remote{}, err
	}
	for _, f := range []struct {
		path, body string
		mode       os.FileMode
	}{{rem.Key, b.Key, 0o600}, {rem.Cert, b.Cert, 0o644}, {rem.CA, b.CA, 0o644}, {r.urlFile(name), b.URL + "\n", 0o644}} {
		if err := atomicfile.WriteFile(f.path, []byte(f.body), f.mode); err != nil {
			return Remote{}, fmt.Errorf("remote %q: %w", name, err)
		}
	}
	return rem, nil
}

func (r Remotes) urlFile(name string) string { return filepath.Join(r.Dir, name, "url") }

// Get is the remote stored as name.
func (r Remotes) Get(name string) (Remote, error) {
	if spec.ValidName(name) != nil {
		return Remote{}, fmt.Errorf("--remote %s: neither a URL (https://HOST:PORT, unix:///PATH) nor a remote's name", name)
	}
	u, err := os.ReadFile(r.urlFile(name))
	if errors.Is(err, fs.ErrNotExist) {
		return Remote{}, fmt.Errorf("--remote %s: no such remote in %s (vmsup remote add %s URL --bundle FILE, or give a URL)", name, r.Dir, name)
	}
	if err != nil {
		return Remote{}, err
	}
	rem := r.files(name)
	rem.URL = strings.TrimSpace(string(u))
	return rem, nil
}

// List is the stored remotes, by name.
func (r Remotes) List() ([]Remote, error) {
	ents, err := os.ReadDir(r.Dir)
	if errors.Is(err, fs.ErrNotExist) {
		return nil, nil
	}
	if err != nil {
		return nil, err
	}
	var out []Remote
	for _, e := range ents {
		if rem, err := r.Get(e.Name()); err == nil {
			out = append(out, rem)
		}
	}
	sort.Slice(out, func(i, j int) bool { return out[i].Name < out[j].Name })
	return out, nil
}

// Remove forgets the remote name.
func (r Remotes) Remove(name string) error {
	if _, err := r.Get(name); err != nil {
		return err
	}
	return os.RemoveAll(filepath.Join(r.Dir, name))
}

func dirOf(p string) string { return filepath.Dir(p) }
