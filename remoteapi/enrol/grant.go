package enrol

import (
	"bytes"
	"errors"
	"fmt"
	"io/fs"
	"os"
	"slices"

	"github.com/pelletier/go-toml/v2"

	"github.com/vmsup/vmsup/internal/util/atomicfile"
	"github.com/vmsup/vmsup/remoteapi"
)

// EnsureConfig writes the server's configuration at path if there is none:
// the PKI's files and no grant yet (api cert adds them). An existing file
// is left as it is: it may have been written by hand.
func EnsureConfig(path string, p *PKI) (created bool, err error) {
	if _, err := os.Stat(path); !errors.Is(err, fs.ErrNotExist) {
		return false, err
	}
	body := fmt.Sprintf(`# Written by vmsup api install; vmsup api cert adds the grants.
# docs/remote-api.md describes every key.
ca = %q
cert = %q
key = %q
`, p.CAFile(), p.ServerFile(), p.ServerKeyFile())
	if err := os.MkdirAll(dirOf(path), 0o700); err != nil {
		return false, err
	}
	return true, atomicfile.WriteFile(path, []byte(body), 0o600)
}

// AddGrant appends a grant to the configuration at path, unless it has
// that very grant already. The file is read back through the server's own
// checks first and after: a grant the server would refuse is not written.
func AddGrant(path string, g remoteapi.Grant) (added bool, err error) {
	cfg, err := remoteapi.LoadConfig(path)
	if err != nil {
		return false, err
	}
	for _, have := range cfg.Grants {
		if have.Identity == g.Identity && have.Role == g.Role && slices.Equal(have.VMs, g.VMs) {
			return false, nil
		}
	}
	old, err := os.ReadFile(path)
	if err != nil {
		return false, err
	}
	var b bytes.Buffer
	b.Write(old)
	if len(old) > 0 && old[len(old)-1] != '\n' {
		b.WriteByte('\n')
	}
	enc, err := toml.Marshal(struct {
		Grant []remoteapi.Grant `toml:"grant"`
	}{[]remoteapi.Grant{g}})
	if err != nil {
		return false, err
	}
	b.WriteString("\n")
	b.Write(enc)
	tmp := path + ".new"
	if err := os.WriteFile(tmp, b.Bytes(), 0o600); err != nil {
		return false, err
	}
	defer os.Remove(tmp)
	if _, err := remoteapi.LoadConfig(tmp); err != nil {
		return false, err
	}
	return true, atomicfile.WriteFile(path, b.Bytes(), 0o600)
}
