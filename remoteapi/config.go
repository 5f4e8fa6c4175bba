package remoteapi

import (
	"bytes"
	"errors"
	"fmt"
	"path"
	"path/filepath"
	"strings"
	"time"

	"github.com/pelletier/go-toml/v2"

	"github.com/vmsup/vmsup/internal/host/userfile"
)

// Role is what a client may do to the VMs a grant names.
type Role string

// Roles, each allowing what the ones before it do.
const (
	// ReadOnly: list, status, stats, events, logs, snapshot ls, plan.
	ReadOnly Role = "read-only"
	// Operator: also up, apply, down, kill, restart, reboot, reset,
	// pause, resume, snapshot create/revert/rm.
	Operator Role = "operator"
	// Admin: also exec in the guest and --adopt (taking a VM over from
	// the file it was started from on the host).
	Admin Role = "admin"
)

var roleRank = map[Role]int{ReadOnly: 1, Operator: 2, Admin: 3}

// allows reports whether r includes need.
func (r Role) allows(need Role) bool { return roleRank[r] >= roleRank[need] }

// Config is the server's configuration file (TOML; docs/remote-api.md).
type Config struct {
	// CA, Cert and Key are PEM files: the CA client certificates must be
	// signed by, and the server's certificate and key (TCP listeners).
	CA   string `toml:"ca"`
	Cert string `toml:"cert"`
	Key  string `toml:"key"`
	// IdleExit: the server exits after this long without a call in
	// flight (default 10s); idle connections do not count.
	IdleExit Duration `toml:"idle_exit"`
	// CallTimeout bounds a call (default 10m); StreamTimeout a followed
	// stream (events -f, logs -f; default 1h).
	CallTimeout   Duration `toml:"call_timeout"`
	StreamTimeout Duration `toml:"stream_timeout"`
	// MaxCallsPerClient: calls of one identity at once (default 8); more
	// are refused (too-many), not queued.
	MaxCallsPerClient int `toml:"max_calls_per_client"`
	// MaxRequest: bytes of a request body (default 4 MiB: a few VM files).
	MaxRequest int64 `toml:"max_request"`
	// BackupDirs are where a remote backup may write (absolute
	// directories; default ROOT/backups): `backup --to DIR` names one of
	// them or a place below, and a relative DIR is below the first.
	BackupDirs []string `toml:"backup_dirs"`
	// Grants say who may do what to which VMs.
	Grants []Grant `toml:"grant"`

	path string
}

// Grant gives an identity a role for the VMs whose names match one of
// VMs (path.Match patterns; "*" for all).
type Grant struct {
	// Identity is "cn:NAME" (the common name of a client certificate the
	// CA signed) or "uid:N" (a local user on the unix socket, from its
	// peer credentials).
	Identity string   `toml:"identity"`
	Role     Role     `toml:"role"`
	VMs      []string `toml:"vms"`
}

// Duration is a TOML duration string ("10s").
type Duration time.Duration

// UnmarshalText reads "10s".
func (d *Duration) UnmarshalText(b []byte) error {
	v, err := time.ParseDuration(string(b))
	if err != nil {
		return err
	}
	*d = Duration(v)
	return nil
}

// Defaults of Config.
const (
	DefaultIdleExit          = 10 * time.Second
	DefaultCallTimeout       = 10 * time.Minute
	DefaultStreamTimeout     = time.Hour
	DefaultMaxCallsPerClient = 8
	DefaultMaxRequest        = 4 << 20
)

// LoadConfig reads and checks the configuration file at p.
func LoadConfig(p string) (*Config, error) {
	data, err := userfile.Read(p, 1<<20)
	if err != nil {
		return nil, err
	}
	c := &Config{path: p}
	dec := toml.NewDecoder(bytes.NewReader(data)).DisallowUnknownFields()
	if err := dec.Decode(c); err != nil {
		var sm *toml.StrictMissingError
		var de *toml.DecodeError
		switch {
		case errors.As(err, &sm) && len(sm.Errors) > 0:
			row, col := sm.Errors[0].Position()
			return nil, fmt.Errorf("%s:%d:%d: %s: unknown key", p, row, col, strings.Join(sm.Errors[0].Key(), "."))
		case errors.As(err, &de):
			row, col := de.Position()
			return nil, fmt.Errorf("%s:%d:%d: %s", p, row, col, de.Error())
		}
		return nil, fmt.Errorf("%s: %w", p, err)
	}
	return c, c.check()
}

func (c *Config) check() error {
	c.fill()
	var errs []error
	for i, d := range c.BackupDirs {
		if !filepath.IsAbs(d) {
			errs = append(errs, fmt.Errorf("%s: backup_dirs[%d]: %q: want an absolute directory", c.path, i, d))
		}
	}
	for i, g := range c.Grants {
		field := fmt.Sprintf("%s: grant[%d]", c.path, i)
		if !strings.HasPrefix(g.Identity, "cn:") && !strings.HasPrefix(g.Identity, "uid:") {
			errs = append(errs, fmt.Errorf("%s.identity: %q: want \"cn:NAME\" or \"uid:N\"", field, g.Identity))
		}
		if roleRank[g.Role] == 0 {
			errs = append(errs, fmt.Errorf("%s.role: %q: want read-only, operator or admin", field, g.Role))
		}
		if len(g.VMs) == 0 {
			errs = append(errs, fmt.Errorf("%s.vms: missing (\"*\" for every VM)", field))
		}
		for j, p := range g.VMs {
			if _, err := path.Match(p, ""); err != nil {
				errs = append(errs, fmt.Errorf("%s.vms[%d]: %q: %w", field, j, p, err))
			}
		}
	}
	return errors.Join(errs...)
}

// fill sets the defaults of what is not set.
func (c *Config) fill() {
	set := func(d *Duration, def time.Duration) {
		if *d <= 0 {
			*d = Duration(def)
		}
	}
	set(&c.IdleExit, DefaultIdleExit)
	set(&c.CallTimeout, DefaultCallTimeout)
	set(&c.StreamTimeout, DefaultStreamTimeout)
	if c.MaxCallsPerClient <= 0 {
		c.MaxCallsPerClient = DefaultMaxCallsPerClient
	}
	if c.MaxRequest <= 0 {
		c.MaxRequest = DefaultMaxRequest
	}
}

// RoleFor is the highest role identity has for VM vm ("" for none).
func (c *Config) RoleFor(identity, vm string) Role {
	var best Role
	for _, g := range c.Grants {
		if g.Identity != identity || roleRank[g.Role] <= roleRank[best] {
			continue
		}
		for _, p := range g.VMs {
			if ok, _ := path.Match(p, vm); ok {
				best = g.Role
				break
			}
		}
	}
	return best
}

// known reports whether identity has any grant.
func (c *Config) known(identity string) bool {
	for _, g := range c.Grants {
		if g.Identity == identity {
			return true
		}
	}
	return false
}
