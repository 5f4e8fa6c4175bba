package supervisor

import (
	"bytes"
	"context"
	"crypto/subtle"
	"encoding/hex"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net"
	"sync"
	"time"
)

// The migration stream between hosts goes through vmsup, not QEMU's own
// sockets: each QEMU migrates over a unix socket in its state directory and
// vmsup relays it over TCP (source: unix listener -> TCP dial; destination:
// TCP listener -> unix dial). So QEMU needs no network access at all (a
// confined QEMU may have only AF_UNIX sockets and a private network
// namespace), and the destination's TCP port accepts only connections that
// first present the token the destination handed the source over the
// authenticated transport. Every connection is relayed (multifd opens
// several); postcopy's return path flows back on the main one.

const relayTokenLen = 16

// migRelay accepts on ln and bridges each connection to a fresh one from
// dial. Close stops it and cuts every bridged connection.
type migRelay struct {
	ln    net.Listener
	log   *slog.Logger
	mu    sync.Mutex
	conns map[net.Conn]struct{}
	done  bool
	wg    sync.WaitGroup
}

// startRelay serves ln. hello, if set, runs on each accepted connection
// before dialing (the destination checks the token there); greet, if set,
// runs on each dialed connection before copying (the source sends it).
func startRelay(ln net.Listener, dial func() (net.Conn, error), hello, greet func(net.Conn) error, log *slog.Logger) *migRelay {
	r := &migRelay{ln: ln, log: log, conns: map[net.Conn]struct{}{}}
	r.wg.Add(1)
	go func() {
		defer r.wg.Done()
		for {
			c, err := ln.Accept()
			if err != nil {
				return
			}
			if !r.track(c) {
				c.Close()
				return
			}
			r.wg.Add(1)
			go func() {
				defer r.wg.Done()
				r.bridge(c, dial, hello, greet)
			}()
		}
	}()
	return r
}

func (r *migRelay) track(c net.Conn) bool {
	r.mu.Lock()
	defer r.mu.Unlock()
	if r.done {
		return false
	}
	r.conns[c] = struct{}{}
	return true
}

func (r *migRelay) untrack(c net.Conn) {
	r.mu.Lock()
	delete(r.conns, c)
	r.mu.Unlock()
	c.Close()
}

func (r *migRelay) bridge(in net.Conn, dial func() (net.Conn, error), hello, greet func(net.Conn) error) {
	defer r.untrack(in)
	if hello != nil {
		if err := hello(in); err != nil {
			r.log.Warn("migration relay: refused a connection", "from", in.RemoteAddr(), "err", err)
			return
		}
	}
	out, err := dial()
	if err != nil {
		r.log.Warn("migration relay: dial", "err", err)
		return
	}
	if !r.track(out) {
		out.Close()
		return
	}
	defer r.untrack(out)
	if greet != nil {
		if err := greet(out); err != nil {
			return
		}
	}
	// Both directions; a clean EOF is passed on as a half-close, any error
	// cuts both connections.
	errc := make(chan error, 2)
	cp := func(dst, src net.Conn) {
		_, err := io.Copy(dst, src)
		if err == nil {
			if cw, ok := dst.(interface{ CloseWrite() error }); ok {
				_ = cw.CloseWrite()
			}
		}
		errc <- err
	}
	go cp(out, in)
	go cp(in, out)
	for range 2 {
		if err := <-errc; err != nil {
			in.Close()
			out.Close()
		}
	}
}

// Close stops accepting, cuts all bridged connections and waits for the
// relay's goroutines.
func (r *migRelay) Close() {
	r.mu.Lock()
	r.done = true
	for c := range r.conns {
		c.Close()
	}
	r.mu.Unlock()
	r.ln.Close()
	r.wg.Wait()
}

func newRelayToken() string { return randHex(relayTokenLen) }

// sendToken is the source's greeting on each TCP connection.
func sendToken(tok string) func(net.Conn) error {
	return func(c net.Conn) error {
		_, err := c.Write([]byte(tok))
		return err
	}
}

// checkToken reads and checks the greeting within a few seconds.
func checkToken(tok string) func(net.Conn) error {
	return func(c net.Conn) error {
		buf := make([]byte, len(tok))
		_ = c.SetReadDeadline(time.Now().Add(10 * time.Second))
		if _, err := io.ReadFull(c, buf); err != nil {
			return fmt.Errorf("no token: %w", err)
		}
		_ = c.SetReadDeadline(time.Time{})
		if subtle.ConstantTimeCompare(buf, []byte(tok)) != 1 {
			return errors.New("wrong token " + hex.EncodeToString(bytes.TrimSpace(buf[:4])) + "...")
		}
		return nil
	}
}

// defaultDial is MigrateOptions.Dial's default.
func defaultDial(ctx context.Context, network, address string) (net.Conn, error) {
	var d net.Dialer
	return d.DialContext(ctx, network, address)
}
