package remoteapi

import (
	"context"
	"errors"
	"fmt"
	"net"
	"net/http"
	"strings"
	"time"

	"github.com/coder/websocket"

	"github.com/vmsup/vmsup/internal/console/vncproxy"
)

// Sessions: the serial console and the VNC server of a VM, each a
// websocket of raw bytes (binary messages) bridged to the VM's unix socket
// by the graphical console's proxy (internal/console/vncproxy.Pipe). An open
// session is a call in flight: it keeps the server up and holds one of its
// client's calls until it ends, at stream_timeout at the latest.

// Bounds of a session that are not configurable.
const (
	// sessionDial bounds connecting to the VM's socket.
	sessionDial = 10 * time.Second
	// pingEvery: the server pings the client this often and drops a
	// session whose client does not answer within pingWait.
	pingEvery = 30 * time.Second
	pingWait  = 15 * time.Second
	// SessionReadLimit is the largest websocket message either side of a
	// session reads.
	SessionReadLimit = 1 << 20
)

func (s *Server) sessionRoutes() []route {
	return []route{
		{Pattern: "GET /v1/vms/{name}/console", Summary: "the serial console: a websocket (Upgrade: websocket) of raw bytes both ways, in binary messages", Upgrade: true, Long: true,
			h: func(c *call) (any, error) { return nil, s.session(c, s.Ops.DialConsole) }},
		{Pattern: "GET /v1/vms/{name}/vnc", Summary: "the VNC server (RFB, [display] with vnc): a websocket (Upgrade: websocket) of raw bytes both ways, in binary messages", Upgrade: true, Long: true,
			h: func(c *call) (any, error) { return nil, s.session(c, s.Ops.DialVNC) }},
		{Pattern: "POST /v1/vms/{name}/vnc-ticket", Summary: "a one-time VNC password for a VM with display.password, valid for ttl (\"\" for a VM without)", Body: TicketRequest{}, Result: Ticket{},
			h: func(c *call) (any, error) {
				req, err := decode[TicketRequest](c)
				if err != nil {
					return nil, err
				}
				if req.TTL <= 0 {
					return nil, newError(KindUsage, "vnc ticket: ttl must be positive")
				}
				return vmCall(c, Operator, func(ctx ctxT, name string) (Ticket, error) {
					pw, err := s.Ops.VNCTicket(ctx, name, req.TTL)
					return Ticket{Password: pw}, err
				})
			}},
	}
}

// session serves one websocket session: the caller needs operator for the
// VM; the VM's socket is dialled before the upgrade, so a VM that is not
// running (or has no VNC server) is answered as any call's error.
func (s *Server) session(c *call, dial func(context.Context, string) (net.Conn, error)) error {
	if !isUpgrade(c.r) {
		return newError(KindUsage, fmt.Sprintf("vmsup api: %s opens a websocket: send Upgrade: websocket", c.route))
	}
	if err := c.allow(Operator, c.name()); err != nil {
		return err
	}
	dctx, cancel := context.WithTimeout(c.ctx, sessionDial)
	vm, err := dial(dctx, c.name())
	cancel()
	if err != nil {
		return err
	}
	defer vm.Close()
	// Answered by the upgrade, or by Accept's own refusal (it allows the
	// same origin only).
	c.streaming = true
	ws, err := websocket.Accept(c.w, c.r, nil)
	if err != nil {
		s.Logger.Debug("websocket", "call", c.route, "vm", c.name(), "err", err)
		return nil
	}
	defer ws.CloseNow()
	ws.SetReadLimit(SessionReadLimit)
	// The session ends when either side leaves, its client stops answering
	// pings, or at stream_timeout, which the client is told.
	ctx, stop := context.WithCancel(context.WithoutCancel(c.ctx))
	defer stop()
	go keepalive(ctx, ws, stop)
	ended := context.AfterFunc(c.ctx, func() {
		if errors.Is(c.ctx.Err(), context.DeadlineExceeded) {
			ws.Close(websocket.StatusPolicyViolation, cut(fmt.Sprintf("vmsup api: stopped after stream_timeout %s", s.Config.StreamTimeout.D()), 120))
		}
		stop()
	})
	defer ended()
	err = vncproxy.Pipe(ctx, websocket.NetConn(ctx, ws, websocket.MessageBinary), vm)
	s.Logger.Debug("session ended", "call", c.route, "vm", c.name(), "identity", c.id, "err", err)
	return nil
}

// keepalive pings the client every pingEvery and ends the session (stop)
// when one is not answered within pingWait: a client that vanished
// without closing does not hold its session until stream_timeout.
func keepalive(ctx context.Context, ws *websocket.Conn, stop func()) {
	t := time.NewTicker(pingEvery)
	defer t.Stop()
	for {
		select {
		case <-ctx.Done():
			return
		case <-t.C:
			pctx, cancel := context.WithTimeout(ctx, pingWait)
			err := ws.Ping(pctx)
			cancel()
			if err != nil {
				stop()
				return
			}
		}
	}
}

// isUpgrade reports whether r asks for a websocket.
func isUpgrade(r *http.Request) bool { return strings.EqualFold(r.Header.Get("Upgrade"), "websocket") }
