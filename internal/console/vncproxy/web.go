package vncproxy

import (
	"context"
	"crypto/rand"
	"crypto/subtle"
	"encoding/base64"
	"errors"
	"fmt"
	"net"
	"net/http"
	"net/url"
	"strings"
	"sync"
	"time"

	"github.com/coder/websocket"
)

// NoVNCDir is where Debian's novnc package puts noVNC.
const NoVNCDir = "/usr/share/novnc"

// ErrNoNoVNC is the error when noVNC is not installed.
var ErrNoNoVNC = errors.New("noVNC is not installed (apt-get install novnc)")

// Web serves noVNC and a websocket to the VM's VNC server for one browser
// session. Every path is under /TOKEN/: a request without the token gets
// a bare 404, as does every request once the token was used by a session's
// websocket (it is one-time) or its wait ran out (then nothing listens).
type Web struct {
	Dir      string        // noVNC's files; NoVNCDir when empty
	Token    string        // NewToken's
	Wait     time.Duration // how long the token waits for its session
	Password string        // the VNC server's one-time password, given to noVNC in the URL; "" for none
	Dial     Dialer
}

// NewToken returns a fresh random token (128 bits, URL-safe).
func NewToken() (string, error) {
	b := make([]byte, 16)
	if _, err := rand.Read(b); err != nil {
		return "", err
	}
	return base64.RawURLEncoding.EncodeToString(b), nil
}

// URL is the page a browser opens to see the console, on addr (the
// listener's address). The token is in it, so the URL is the secret.
func (w *Web) URL(addr string) string {
	q := url.Values{}
	q.Set("autoconnect", "1")
	q.Set("resize", "scale")
	q.Set("reconnect", "0")
	q.Set("path", w.Token+"/websockify")
	if w.Password != "" {
		q.Set("password", w.Password)
	}
	return "http://" + addr + "/" + w.Token + "/vnc.html?" + q.Encode()
}

// webState is one Serve's: whether the token was used, the session's end.
type webState struct {
	w      *Web
	ln     net.Listener
	mu     sync.Mutex
	used   bool
	ended  chan error
	active chan struct{} // closed when the session's websocket opened
}

// Serve serves on ln until the session that used the token ends (its
// result), or until Wait passes with no session (ErrNoClient), or ctx is
// done. ln is closed as soon as the session starts: nothing else connects.
func (w *Web) Serve(ctx context.Context, ln net.Listener) error {
	dir := w.Dir
	if dir == "" {
		dir = NoVNCDir
	}
	if w.Token == "" || w.Dial == nil {
		return errors.New("vncproxy: Web needs a Token and a Dial")
	}
	st := &webState{w: w, ln: ln, ended: make(chan error, 1), active: make(chan struct{})}
	files := http.StripPrefix("/"+w.Token, http.FileServer(http.Dir(dir)))
	srv := &http.Server{
		Handler:           st.handler(ctx, files),
		ReadHeaderTimeout: 10 * time.Second,
	}
	served := make(chan error, 1)
	go func() { served <- srv.Serve(ln) }()
	defer srv.Close()
	timer := time.NewTimer(w.Wait)
	defer timer.Stop()
	for {
		select {
		case err := <-st.ended:
			return err
		case <-timer.C:
			select {
			case <-st.active:
				continue // the session runs; it ends by itself
			default:
			}
			st.expire()
			return fmt.Errorf("%w within %s: the token has expired", ErrNoClient, w.Wait)
		case err := <-served:
			select {
			case <-st.active:
				continue // ln closed for the session
			default:
			}
			if errors.Is(err, http.ErrServerClosed) {
				err = nil
			}
			return err
		case <-ctx.Done():
			return ctx.Err()
		}
	}
}

// expire makes the token worthless: used up, nothing listening.
func (st *webState) expire() {
	st.mu.Lock()
	st.used = true
	st.mu.Unlock()
	st.ln.Close()
}

// valid reports whether path is under the token and the token is unused;
// take also uses it up (the session's websocket).
func (st *webState) valid(path string, take bool) bool {
	tok, _, _ := strings.Cut(strings.TrimPrefix(path, "/"), "/")
	if subtle.ConstantTimeCompare([]byte(tok), []byte(st.w.Token)) != 1 {
		return false
	}
	st.mu.Lock()
	defer st.mu.Unlock()
	if st.used {
		return false
	}
	st.used = st.used || take
	return true
}

func (st *webState) handler(ctx context.Context, files http.Handler) http.Handler {
	ws := "/" + st.w.Token + "/websockify"
	return http.HandlerFunc(func(rw http.ResponseWriter, r *http.Request) {
		rw.Header().Set("Cache-Control", "no-store")
		rw.Header().Set("Referrer-Policy", "no-referrer")
		if r.URL.Path == ws {
			if !st.valid(r.URL.Path, true) {
				http.NotFound(rw, r)
				return
			}
			st.session(ctx, rw, r)
			return
		}
		if (r.Method != http.MethodGet && r.Method != http.MethodHead) || !st.valid(r.URL.Path, false) {
			http.NotFound(rw, r)
			return
		}
		files.ServeHTTP(rw, r)
	})
}

// session is the websocket of the one session: the listener closes, the
// VM's socket is dialled, bytes flow until either side ends.
func (st *webState) session(ctx context.Context, rw http.ResponseWriter, r *http.Request) {
	c, err := websocket.Accept(rw, r, nil) // same-origin only (the page is ours)
	if err != nil {
		st.ended <- fmt.Errorf("websocket: %w", err)
		return
	}
	close(st.active)
	st.ln.Close()
	defer c.CloseNow()
	vm, err := st.w.Dial(ctx)
	if err != nil {
		c.Close(websocket.StatusInternalError, "VM's VNC server unreachable")
		st.ended <- err
		return
	}
	defer vm.Close()
	st.ended <- Pipe(ctx, websocket.NetConn(ctx, c, websocket.MessageBinary), vm)
}
