package vncproxy

import (
	"context"
	"errors"
	"fmt"
	"io"
	"net"
	"sync"
	"time"
)

// Dialer connects to the VM's VNC server, once per session.
type Dialer func(ctx context.Context) (net.Conn, error)

// ErrNoClient is the error when no client came within the wait.
var ErrNoClient = errors.New("no client came")

// ServeOne waits at most wait for one client on ln, closes ln (nothing
// listens any more), connects it to the VM through dial and copies both
// ways until either side ends or ctx is done.
func ServeOne(ctx context.Context, ln net.Listener, wait time.Duration, dial Dialer) error {
	type accepted struct {
		c   net.Conn
		err error
	}
	got := make(chan accepted, 1)
	go func() {
		c, err := ln.Accept()
		got <- accepted{c, err}
	}()
	timer := time.NewTimer(wait)
	defer timer.Stop()
	var a accepted
	select {
	case a = <-got:
	case <-timer.C:
		ln.Close()
		return fmt.Errorf("%w within %s", ErrNoClient, wait)
	case <-ctx.Done():
		ln.Close()
		return ctx.Err()
	}
	ln.Close()
	if a.err != nil {
		return a.err
	}
	defer a.c.Close()
	vm, err := dial(ctx)
	if err != nil {
		return err
	}
	defer vm.Close()
	return Pipe(ctx, a.c, vm)
}

// Pipe copies between a and b until either ends (then both are closed)
// or ctx is done. A side that ends by closing is not an error.
func Pipe(ctx context.Context, a, b net.Conn) error {
	var once sync.Once
	closeBoth := func() { once.Do(func() { a.Close(); b.Close() }) }
	errs := make(chan error, 2)
	cp := func(dst, src net.Conn) {
		_, err := io.Copy(dst, src)
		closeBoth()
		errs <- err
	}
	go cp(a, b)
	go cp(b, a)
	select {
	case err := <-errs:
		<-errs
		if err != nil && !errors.Is(err, net.ErrClosed) {
			return err
		}
		return nil
	case <-ctx.Done():
		closeBoth()
		<-errs
		<-errs
		return ctx.Err()
	}
}
