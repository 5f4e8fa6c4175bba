package client

import (
	"context"
	"encoding/json"
	"fmt"
	"net"
	"net/http"
	"strings"
	"time"

	"github.com/coder/websocket"

	"github.com/vmsup/vmsup/remoteapi"
)

// DialConsole is GET /v1/vms/{name}/console upgraded to a websocket: the
// VM's serial console as a net.Conn of raw bytes. ctx bounds the
// handshake only; the connection lasts until it is closed or the server
// ends the session.
func (c *Client) DialConsole(ctx context.Context, name string) (net.Conn, error) {
	return c.session(ctx, vm(name, "console"))
}

// DialVNC is GET /v1/vms/{name}/vnc upgraded to a websocket: the VM's VNC
// server (RFB) as a net.Conn.
func (c *Client) DialVNC(ctx context.Context, name string) (net.Conn, error) {
	return c.session(ctx, vm(name, "vnc"))
}

// VNCTicket is POST /v1/vms/{name}/vnc-ticket.
func (c *Client) VNCTicket(ctx context.Context, name string, ttl time.Duration) (string, error) {
	var out remoteapi.Ticket
	err := c.call(ctx, http.MethodPost, vm(name, "vnc-ticket"), nil, remoteapi.TicketRequest{TTL: ttl}, &out)
	return out.Password, err
}

// session opens a websocket session at path. A refusal before the upgrade
// is the server's error as any call's.
func (c *Client) session(ctx context.Context, path string) (net.Conn, error) {
	u := "ws" + strings.TrimPrefix(c.base, "http") + path // https -> wss
	ws, resp, err := websocket.Dial(ctx, u, &websocket.DialOptions{HTTPClient: c.http})
	if err != nil {
		if resp != nil && resp.Header.Get("Content-Type") == "application/json" {
			var a remoteapi.Answer[json.RawMessage]
			if json.NewDecoder(resp.Body).Decode(&a) == nil && a.Error != nil {
				return nil, a.Error
			}
		}
		return nil, fmt.Errorf("vmsup --remote: GET %s: %w", path, err)
	}
	ws.SetReadLimit(remoteapi.SessionReadLimit)
	// The connection's lifetime is its own (Close), not the dial's ctx.
	return websocket.NetConn(context.Background(), ws, websocket.MessageBinary), nil
}
