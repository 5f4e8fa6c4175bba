package migwire

import (
	"bytes"
	"context"
	"crypto/rand"
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

// Relay accepts on ln and bridges each connection to a fresh one from
// dial. Close stops it and cuts every bridged connection.
type Relay struct {
	ln    net.Listener
	log   *slog.Logger
	mu    sync.Mutex
	conns map[net.Conn]struct{}
	done  bool
	wg    sync.WaitGroup
	// QEMU 7.2 takes the first connection to its incoming socket as the
	// main channel and the others as multifd channels: the destination
	// dials QEMU in the order the source's QEMU connected (seq).
	order  *sync.Cond
	dialed int
}

// StartRelay serves ln. hello, if set, runs on each accepted connection
// before dialing (the destination checks the token there); greet, if set,
// runs on each dialed connection before copying (the source sends it).
func StartRelay(ln net.Listener, dial func() (net.Conn, error), hello func(net.Conn) (int, error), greet func(net.Conn, int) error, log *slog.Logger) *Relay {
	r := &Relay{ln: ln, log: log, conns: map[net.Conn]struct{}{}}
	r.order = sync.NewCond(&r.mu)
	r.wg.Add(1)
	go func() {
		defer r.wg.Done()
		for seq := 0; ; seq++ {
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
				r.bridge(c, seq, dial, hello, greet)
			}()
		}
	}()
	return r
}

func (r *Relay) track(c net.Conn) bool {
	r.mu.Lock()
	defer r.mu.Unlock()
	if r.done {
		return false
	}
	r.conns[c] = struct{}{}
	return true
}

func (r *Relay) untrack(c net.Conn) {
	r.mu.Lock()
	delete(r.conns, c)
	r.mu.Unlock()
	c.Close()
}

func (r *Relay) bridge(in net.Conn, seq int, dial func() (net.Conn, error), hello func(net.Conn) (int, error), greet func(net.Conn, int) error) {
	defer r.untrack(in)
	ordered := false
	if hello != nil {
		var err error
		if seq, err = hello(in); err != nil {
			r.log.Warn("migration relay: refused a connection", "from", in.RemoteAddr(), "err", err)
			return
		}
		ordered = true
	}
	if ordered {
		r.mu.Lock()
		for r.dialed != seq && !r.done {
			r.order.Wait()
		}
		r.mu.Unlock()
	}
	out, err := dial()
	if ordered {
		r.mu.Lock()
		r.dialed++
		r.order.Broadcast()
		r.mu.Unlock()
	}
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
		if err := greet(out, seq); err != nil {
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
func (r *Relay) Close() {
	r.mu.Lock()
	r.done = true
	for c := range r.conns {
		c.Close()
	}
	r.order.Broadcast()
	r.mu.Unlock()
	r.ln.Close()
	r.wg.Wait()
}

func NewToken() string { return RandHex(relayTokenLen) }

// SendToken is the source's greeting on each TCP connection: the token,
// then the connection's sequence number (4 bytes, big endian).
func SendToken(tok string) func(net.Conn, int) error {
	return func(c net.Conn, seq int) error {
		b := append([]byte(tok), byte(seq>>24), byte(seq>>16), byte(seq>>8), byte(seq))
		_, err := c.Write(b)
		return err
	}
}

// CheckToken reads and checks the greeting within a few seconds and
// returns the sequence number.
func CheckToken(tok string) func(net.Conn) (int, error) {
	return func(c net.Conn) (int, error) {
		buf := make([]byte, len(tok)+4)
		_ = c.SetReadDeadline(time.Now().Add(10 * time.Second))
		if _, err := io.ReadFull(c, buf); err != nil {
			return 0, fmt.Errorf("no token: %w", err)
		}
		_ = c.SetReadDeadline(time.Time{})
		if subtle.ConstantTimeCompare(buf[:len(tok)], []byte(tok)) != 1 {
			return 0, errors.New("wrong token " + hex.EncodeToString(bytes.TrimSpace(buf[:4])) + "...")
		}
		b := buf[len(tok):]
		seq := int(b[0])<<24 | int(b[1])<<16 | int(b[2])<<8 | int(b[3])
		if seq < 0 || seq > 1024 {
			return 0, fmt.Errorf("bad sequence number %d", seq)
		}
		return seq, nil
	}
}

// DefaultDial is MigrateOptions.Dial's default.
func DefaultDial(ctx context.Context, network, address string) (net.Conn, error) {
	var d net.Dialer
	return d.DialContext(ctx, network, address)
}

// RandHex returns n random bytes in hex (tokens, one-off file names).
func RandHex(n int) string {
	b := make([]byte, n)
	_, _ = rand.Read(b)
	return hex.EncodeToString(b)
}
