package remoteapi_test

import (
	"context"
	"fmt"
	"io"
	"net"
	"testing"
	"time"

	"github.com/vmsup/vmsup/internal/console/vncproxy/vncproxytest"
	"github.com/vmsup/vmsup/remoteapi"
	"github.com/vmsup/vmsup/supervisor"
)

func (o *blockingOps) dial(ctx context.Context, name string) (net.Conn, error) {
	if name != "quick" {
		return nil, fmt.Errorf("vm %q: %w", name, supervisor.ErrNotRunning)
	}
	var d net.Dialer
	return d.DialContext(ctx, "unix", o.vmSock)
}

func (o *blockingOps) DialConsole(ctx context.Context, name string) (net.Conn, error) {
	return o.dial(ctx, name)
}

func (o *blockingOps) DialVNC(ctx context.Context, name string) (net.Conn, error) {
	return o.dial(ctx, name)
}

// TestSessionWebsocket: a console or VNC session is a websocket bridged to
// the VM's socket, for an operator only (a read-only client is refused and
// audited); a VM that is not running is refused before the upgrade with
// the CLI's error; an open session keeps the server up past idle_exit and
// the server exits once it closes.
func TestSessionWebsocket(t *testing.T) {
	h := startLimits(t, "idle_exit = \"1s\"\n[[grant]]\nidentity = \"cn:v\"\nrole = \"read-only\"\nvms = [\"*\"]")
	if _, _, err := h.pki.Issue("v"); err != nil {
		t.Fatal(err)
	}
	a, v := h.client(t, "a"), h.client(t, "v")
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	_, err := v.DialConsole(ctx, "quick")
	wantAPIError(t, "a read-only console", err, remoteapi.KindForbidden, `vm "quick": cn:v may not console: it needs role operator, cn:v has read-only`)
	_, err = v.DialVNC(ctx, "quick")
	wantAPIError(t, "a read-only VNC session", err, remoteapi.KindForbidden, "cn:v may not vnc")
	wantAudited(t, h, `"identity":"cn:v"`, "GET /v1/vms/{name}/vnc", `"verdict":"refused"`)
	_, err = a.DialConsole(ctx, "slow")
	wantAPIError(t, "the console of a VM that is not running", err, remoteapi.KindNotRunning, `vm "slow"`)

	for _, dial := range []func(context.Context, string) (net.Conn, error){a.DialConsole, a.DialVNC} {
		conn, err := dial(ctx, "quick")
		if err != nil {
			t.Fatal(err)
		}
		greeting := make([]byte, 12)
		if _, err := io.ReadFull(conn, greeting); err != nil || string(greeting) != vncproxytest.Greeting {
			t.Fatalf("greeting through the websocket: %q, %v", greeting, err)
		}
		conn.Write([]byte("ping"))
		back := make([]byte, 4)
		if _, err := io.ReadFull(conn, back); err != nil || string(back) != "ping" {
			t.Fatalf("echo through the websocket: %q, %v", back, err)
		}
		conn.Close()
	}
	conn, err := a.DialConsole(ctx, "quick")
	if err != nil {
		t.Fatal(err)
	}
	select {
	case <-h.servedAt:
		t.Fatal("the server exited with a console session open")
	case <-time.After(3 * time.Second): // idle_exit 1s
	}
	conn.Close()
	h.exited(t, ctx, "the session closed")
}
