package qmp

import (
	"context"
	"fmt"
	"strings"
)

// Typed wrappers for live migration (QEMU 7.2, `man 7 qemu-qmp-ref`,
// section "Migration").

// MigrationCapability is one entry of migrate-set-capabilities.
type MigrationCapability struct {
	Capability string `json:"capability"` // "events", "multifd", "auto-converge", "postcopy-ram", ...
	State      bool   `json:"state"`
}

// MigrateSetCapabilities turns migration capabilities on or off. It must run
// before migrate (and, for the ones both sides need such as multifd and
// postcopy-ram, before migrate-incoming on the destination too).
func (c *Conn) MigrateSetCapabilities(ctx context.Context, caps []MigrationCapability) error {
	args := struct {
		Capabilities []MigrationCapability `json:"capabilities"`
	}{caps}
	return c.Execute(ctx, "migrate-set-capabilities", args, nil)
}

// MigrationParameters is the subset of migrate-set-parameters vmsup sets;
// nil fields are left as they are.
type MigrationParameters struct {
	MaxBandwidth    *int64 `json:"max-bandwidth,omitempty"`    // bytes per second
	DowntimeLimit   *int64 `json:"downtime-limit,omitempty"`   // milliseconds
	MultifdChannels *int64 `json:"multifd-channels,omitempty"` // both sides
	MaxPostcopyBW   *int64 `json:"max-postcopy-bandwidth,omitempty"`
	CPUThrottleInit *int64 `json:"cpu-throttle-initial,omitempty"`
	// Mode is the migration mode (QEMU 8.2): "normal", "cpr-reboot",
	// "cpr-transfer" (10.0). QEMU keeps it for the next migration.
	Mode *string `json:"mode,omitempty"`
}

// MigrateSetParameters sets migration parameters.
func (c *Conn) MigrateSetParameters(ctx context.Context, p MigrationParameters) error {
	return c.Execute(ctx, "migrate-set-parameters", p, nil)
}

// Migrate starts an outgoing migration to uri ("tcp:HOST:PORT", "unix:PATH").
// It returns at once; progress comes from MIGRATION events and QueryMigrate.
func (c *Conn) Migrate(ctx context.Context, uri string) error {
	args := struct {
		URI string `json:"uri"`
	}{uri}
	return c.Execute(ctx, "migrate", args, nil)
}

// MigrateCPR starts a cpr-transfer migration (mode "cpr-transfer" set
// first): the source's QEMU sends its state and guest RAM's descriptors on
// the unix socket cpr (the destination's cpr channel) before it returns,
// then, once the destination closes that channel (it listens for the
// stream), stops the guest and sends the devices' state to uri.
func (c *Conn) MigrateCPR(ctx context.Context, uri, cpr string) error {
	type addr struct {
		Transport string `json:"transport"`
		Type      string `json:"type"`
		Path      string `json:"path"`
	}
	type channel struct {
		Type string `json:"channel-type"`
		Addr addr   `json:"addr"`
	}
	main, ok := strings.CutPrefix(uri, "unix:")
	if !ok {
		return fmt.Errorf("cpr-transfer streams over a unix socket, not %q", uri)
	}
	args := struct {
		Channels []channel `json:"channels"`
	}{[]channel{{"main", addr{"socket", "unix", main}}, {"cpr", addr{"socket", "unix", cpr}}}}
	return c.Execute(ctx, "migrate", args, nil)
}

// MigrateIncoming makes a QEMU started with "-incoming defer" listen on uri.
// A TCP port 0 lets the kernel choose; QueryMigrate's SocketAddress tells it.
func (c *Conn) MigrateIncoming(ctx context.Context, uri string) error {
	args := struct {
		URI string `json:"uri"`
	}{uri}
	return c.Execute(ctx, "migrate-incoming", args, nil)
}

// MigrateCancel cancels the outgoing migration; the source keeps running.
func (c *Conn) MigrateCancel(ctx context.Context) error {
	return c.Execute(ctx, "migrate_cancel", nil, nil)
}

// MigrateContinue lets a migration paused in state (pre-switchover, with
// the pause-before-switchover capability) go on.
func (c *Conn) MigrateContinue(ctx context.Context, state MigrationStatus) error {
	args := struct {
		State MigrationStatus `json:"state"`
	}{state}
	return c.Execute(ctx, "migrate-continue", args, nil)
}

// MigrateStartPostcopy switches a running precopy migration (with the
// postcopy-ram capability on both sides) to postcopy.
func (c *Conn) MigrateStartPostcopy(ctx context.Context) error {
	return c.Execute(ctx, "migrate-start-postcopy", nil, nil)
}

// MigrationStats is query-migrate's "ram" object.
type MigrationStats struct {
	Transferred      int64   `json:"transferred"`
	Remaining        int64   `json:"remaining"`
	Total            int64   `json:"total"`
	Duplicate        int64   `json:"duplicate"`
	Normal           int64   `json:"normal"`
	NormalBytes      int64   `json:"normal-bytes"`
	DirtyPagesRate   int64   `json:"dirty-pages-rate"`
	Mbps             float64 `json:"mbps"`
	DirtySyncCount   int64   `json:"dirty-sync-count"`
	PageSize         int64   `json:"page-size"`
	MultifdBytes     int64   `json:"multifd-bytes"`
	PagesPerSecond   int64   `json:"pages-per-second"`
	PostcopyRequests int64   `json:"postcopy-requests"`
}

// SocketAddress is a listening address query-migrate reports on the
// destination (type "inet" with host and port).
type SocketAddress struct {
	Type string `json:"type"`
	Host string `json:"host,omitempty"`
	Port string `json:"port,omitempty"`
	Path string `json:"path,omitempty"`
}

// MigrationInfo is query-migrate's reply. Times are milliseconds.
type MigrationInfo struct {
	Status           MigrationStatus `json:"status"`
	RAM              *MigrationStats `json:"ram,omitempty"`
	TotalTime        int64           `json:"total-time,omitempty"`
	ExpectedDowntime int64           `json:"expected-downtime,omitempty"`
	Downtime         int64           `json:"downtime,omitempty"`
	SetupTime        int64           `json:"setup-time,omitempty"`
	CPUThrottle      int64           `json:"cpu-throttle-percentage,omitempty"`
	ErrorDesc        string          `json:"error-desc,omitempty"`
	SocketAddress    []SocketAddress `json:"socket-address,omitempty"`
}

// QueryMigrate reports the state of the current or last migration.
func (c *Conn) QueryMigrate(ctx context.Context) (MigrationInfo, error) {
	var m MigrationInfo
	err := c.Execute(ctx, "query-migrate", nil, &m)
	return m, err
}
