package qmp

import "context"

// The built-in NBD server: exports block nodes (and their dirty bitmaps,
// as "qemu:dirty-bitmap:NAME" metadata contexts) to external clients such
// as a pull-mode backup tool.

// NBDServerStart starts QEMU's NBD server listening on a unix socket.
// There is one server per QEMU.
func (c *Conn) NBDServerStart(ctx context.Context, unixSocket string) error {
	// nbd-server-start takes QEMU's legacy SocketAddress, with the
	// address under "data" (a flat {type, path} is refused in 7.2).
	type unixAddr struct {
		Path string `json:"path"`
	}
	type addr struct {
		Type string   `json:"type"`
		Data unixAddr `json:"data"`
	}
	args := struct {
		Addr addr `json:"addr"`
	}{addr{"unix", unixAddr{unixSocket}}}
	return c.Execute(ctx, "nbd-server-start", args, nil)
}

// NBDServerStartFD starts QEMU's NBD server on a listening socket the
// caller passed with GetFD under fdName (the caller binds it where it
// wants; a confined QEMU needs no path).
func (c *Conn) NBDServerStartFD(ctx context.Context, fdName string) error {
	type fdAddr struct {
		Str string `json:"str"`
	}
	type addr struct {
		Type string `json:"type"`
		Data fdAddr `json:"data"`
	}
	args := struct {
		Addr addr `json:"addr"`
	}{addr{"fd", fdAddr{fdName}}}
	return c.Execute(ctx, "nbd-server-start", args, nil)
}

// NBDServerStop stops the NBD server and removes its exports.
func (c *Conn) NBDServerStop(ctx context.Context) error {
	return c.Execute(ctx, "nbd-server-stop", nil, nil)
}

// BlockExport is block-export-add's argument for an NBD export of NodeName
// under Name (the node name if empty). Bitmaps are dirty bitmaps of the node that
// clients may read; QEMU 7.2 refuses an enabled (recording) bitmap on a
// read-only export: disable it first.
type BlockExport struct {
	ID       string   `json:"id"`
	NodeName string   `json:"node-name"`
	Name     string   `json:"name,omitempty"`
	Writable bool     `json:"writable,omitempty"`
	Bitmaps  []string `json:"bitmaps,omitempty"`
}

// BlockExportAdd exports a node over the NBD server (started first).
func (c *Conn) BlockExportAdd(ctx context.Context, e BlockExport) error {
	args := struct {
		Type string `json:"type"`
		BlockExport
	}{"nbd", e}
	return c.Execute(ctx, "block-export-add", args, nil)
}

// BlockExportDel removes an export. Without hard ("safe") QEMU refuses
// while clients are connected; hard disconnects them. The export is gone
// when BLOCK_EXPORT_DELETED arrives (at once when nobody is connected).
func (c *Conn) BlockExportDel(ctx context.Context, id string, hard bool) error {
	args := struct {
		ID   string `json:"id"`
		Mode string `json:"mode"`
	}{id, "safe"}
	if hard {
		args.Mode = "hard"
	}
	return c.Execute(ctx, "block-export-del", args, nil)
}

// ExportInfo is one entry of query-block-exports.
type ExportInfo struct {
	ID           string `json:"id"`
	Type         string `json:"type"`
	NodeName     string `json:"node-name"`
	ShuttingDown bool   `json:"shutting-down"`
}

// QueryBlockExports lists the block exports.
func (c *Conn) QueryBlockExports(ctx context.Context) ([]ExportInfo, error) {
	var es []ExportInfo
	err := c.Execute(ctx, "query-block-exports", nil, &es)
	return es, err
}
