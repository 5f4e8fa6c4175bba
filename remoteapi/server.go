package remoteapi

import (
	"context"
	"crypto/tls"
	"crypto/x509"
	"errors"
	"fmt"
	"io"
	"log"
	"log/slog"
	"net"
	"net/http"
	"os"
	"strconv"
	"sync"
	"sync/atomic"
	"time"

	"golang.org/x/sys/unix"
)

// Server serves Ops on listeners systemd passed (or any others).
type Server struct {
	Ops    Ops
	Config *Config
	// Root is the state root: ROOT/remote holds the audit logs and the
	// submitted files.
	Root   string
	Logger *slog.Logger

	active atomic.Int64 // calls in flight
	last   atomic.Int64 // when the last call ended (unix nanoseconds)
	mu     sync.Mutex
	calls  map[string]int // calls in flight per identity
}

// Bounds of a connection that are not configurable.
const (
	// headerTimeout bounds a connection's TLS handshake and a request's
	// headers: a client that connects and says nothing is dropped.
	headerTimeout = 10 * time.Second
	// bodyTimeout bounds reading a request's body (decode).
	bodyTimeout = 10 * time.Second
	// writeTimeout bounds each write of an answer: a client that stops
	// reading (its buffers full) loses the call instead of holding it,
	// its call slot and the server up until call_timeout.
	writeTimeout = 10 * time.Second
	// idleConnTimeout closes a kept-alive connection without a request.
	idleConnTimeout = 30 * time.Second
	maxHeaderBytes  = 64 << 10
	shutdownGrace   = 30 * time.Second
)

type ctxKey int

const peerKey ctxKey = 0

// peer is who is on the other end of a unix connection.
type peer struct{ uid int }

// Serve serves on ls until ctx ends or no call has been in flight for
// Config.IdleExit, then stops accepting, closes idle connections, waits
// (30 s at most) for the calls in flight and returns. TCP listeners get
// mutual TLS (Config.CA, Cert, Key); unix ones are plain, the caller known
// by its peer credentials.
func (s *Server) Serve(ctx context.Context, ls []net.Listener) error {
	if len(ls) == 0 {
		return errors.New("vmsup api: no listening sockets (LISTEN_FDS unset: start it by its systemd socket unit)")
	}
	if s.Logger == nil {
		s.Logger = slog.New(slog.NewTextHandler(io.Discard, nil))
	}
	s.calls = map[string]int{}
	s.last.Store(time.Now().UnixNano())
	var tlsConf *tls.Config
	srv := &http.Server{
		Handler:           s.Handler(),
		ReadHeaderTimeout: headerTimeout,
		IdleTimeout:       idleConnTimeout,
		MaxHeaderBytes:    maxHeaderBytes,
		ConnContext:       connContext,
		ErrorLog:          log.New(slogWriter{s.Logger}, "", 0),
	}
	errc := make(chan error, len(ls))
	for _, l := range ls {
		if l.Addr().Network() != "unix" {
			if tlsConf == nil {
				c, err := s.tlsConfig()
				if err != nil {
					return err
				}
				tlsConf = c
			}
			l = tls.NewListener(l, tlsConf)
		}
		go func() { errc <- srv.Serve(l) }()
	}
	err := s.untilIdle(ctx, errc)
	sctx, cancel := context.WithTimeout(context.Background(), shutdownGrace)
	defer cancel()
	if serr := srv.Shutdown(sctx); serr != nil {
		srv.Close()
	}
	return err
}

// untilIdle waits for ctx, a listener's failure or the idle timeout.
func (s *Server) untilIdle(ctx context.Context, errc chan error) error {
	tick := time.NewTicker(200 * time.Millisecond)
	defer tick.Stop()
	for {
		select {
		case <-ctx.Done():
			return nil
		case err := <-errc:
			if errors.Is(err, http.ErrServerClosed) {
				return nil
			}
			return fmt.Errorf("vmsup api: %w", err)
		case <-tick.C:
			idle := time.Since(time.Unix(0, s.last.Load()))
			if s.active.Load() == 0 && idle >= time.Duration(s.Config.IdleExit) {
				s.Logger.Debug("idle: exiting", "idle", idle)
				return nil
			}
		}
	}
}

// tlsConfig is mutual TLS 1.3 with the configured CA and certificate.
func (s *Server) tlsConfig() (*tls.Config, error) {
	c := s.Config
	if c.CA == "" || c.Cert == "" || c.Key == "" {
		return nil, fmt.Errorf("%s: ca, cert and key are needed for a TCP socket (mutual TLS)", c.path)
	}
	cert, err := tls.LoadX509KeyPair(c.Cert, c.Key)
	if err != nil {
		return nil, fmt.Errorf("%s: cert/key: %w", c.path, err)
	}
	pem, err := os.ReadFile(c.CA)
	if err != nil {
		return nil, fmt.Errorf("%s: ca: %w", c.path, err)
	}
	pool := x509.NewCertPool()
	if !pool.AppendCertsFromPEM(pem) {
		return nil, fmt.Errorf("%s: ca: %s holds no PEM certificate", c.path, c.CA)
	}
	return &tls.Config{Certificates: []tls.Certificate{cert}, ClientCAs: pool,
		ClientAuth: tls.RequireAndVerifyClientCert, MinVersion: tls.VersionTLS13}, nil
}

// connContext gives a unix connection's peer credentials to its requests.
func connContext(ctx context.Context, c net.Conn) context.Context {
	uc, ok := c.(*net.UnixConn)
	if !ok {
		return ctx
	}
	raw, err := uc.SyscallConn()
	if err != nil {
		return ctx
	}
	var cred *unix.Ucred
	var cerr error
	if err := raw.Control(func(fd uintptr) { cred, cerr = unix.GetsockoptUcred(int(fd), unix.SOL_SOCKET, unix.SO_PEERCRED) }); err != nil || cerr != nil {
		return ctx
	}
	return context.WithValue(ctx, peerKey, peer{uid: int(cred.Uid)})
}

// identity is the caller of r: "cn:NAME" from its verified certificate,
// "uid:N" from a unix socket's peer credentials, "" if neither.
func identity(r *http.Request) (id, transport string) {
	if r.TLS != nil {
		if len(r.TLS.VerifiedChains) > 0 && len(r.TLS.VerifiedChains[0]) > 0 {
			return "cn:" + r.TLS.VerifiedChains[0][0].Subject.CommonName, "tls"
		}
		return "", "tls"
	}
	if p, ok := r.Context().Value(peerKey).(peer); ok {
		return "uid:" + strconv.Itoa(p.uid), "unix"
	}
	return "", "unknown"
}

// enter counts a call of id in; false if id has MaxCallsPerClient already.
func (s *Server) enter(id string) bool {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.calls[id] >= s.Config.MaxCallsPerClient {
		return false
	}
	s.calls[id]++
	s.active.Add(1)
	return true
}

// leave counts a call of id out.
func (s *Server) leave(id string) {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.calls[id]--; s.calls[id] <= 0 {
		delete(s.calls, id)
	}
	s.last.Store(time.Now().UnixNano())
	s.active.Add(-1)
}

// slogWriter passes net/http's log (failed handshakes) to the logger.
type slogWriter struct{ l *slog.Logger }

func (w slogWriter) Write(b []byte) (int, error) {
	w.l.Debug(string(b))
	return len(b), nil
}
