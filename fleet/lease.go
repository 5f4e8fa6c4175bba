package fleet

import (
	"context"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"time"

	"github.com/vmsup/vmsup/internal/util/atomicfile"
	"go.etcd.io/etcd/api/v3/v3rpc/rpctypes"
	clientv3 "go.etcd.io/etcd/client/v3"
)

// The host's lease is its presence: the host record lives under it, and the
// scheduler fails a host over when it expires. Its ID is kept in a file, so
// an agent restarted (or killed and restarted by systemd) inside the TTL
// takes the same lease back: the host never looks lost, and its VMs never
// move, because of an agent restart.
//
// Timeline at the default TTL of 10 s: the agent renews every TTL/3 (3.3
// s; every second while renewals fail). An agent that has not renewed for
// TTL - SelfFenceMargin (7 s, plus up to 1 s waiting for answers) kills
// its VMs (self-fence) unless it knows no scheduler can act on the lapse
// (hold.go: a majority of etcd members without a leader, or every peer
// cut from etcd too): then no VM can be restarted elsewhere, so they run
// on, and since the next leader gives every lease a full TTL, the 7 s
// count again from when that was asked. The host's guard (a systemd timer)
// kills them 1.25 s after the fence point if the agent could not. etcd
// expires the lease at TTL (10 s); the scheduler, elected on another host,
// then fences the host on Ceph (blocklist, RBD lock takeover) and places
// the VMs elsewhere, whose agents start them (a few seconds more).
type lease struct {
	store *Store
	file  string
	ttl   time.Duration

	mu        sync.Mutex
	id        clientv3.LeaseID
	lastRenew time.Time // the fence point counts from it: a renewal, or a hold
	lastOK    time.Time // the last renewal etcd confirmed (when it was sent)
}

// acquire takes back the lease in the file if etcd still has it, else
// grants a new one and records it.
func (l *lease) acquire(ctx context.Context) (reused bool, err error) {
	c := l.store.Client()
	if b, err := os.ReadFile(l.file); err == nil {
		if id, err := strconv.ParseInt(strings.TrimSpace(string(b)), 16, 64); err == nil {
			cctx, cancel := l.store.ctx(ctx)
			_, kerr := c.KeepAliveOnce(cctx, clientv3.LeaseID(id))
			cancel()
			if kerr == nil {
				l.set(clientv3.LeaseID(id))
				return true, nil
			}
			if !errors.Is(kerr, rpctypes.ErrLeaseNotFound) {
				return false, l.store.explain(kerr)
			}
		}
	}
	cctx, cancel := l.store.ctx(ctx)
	defer cancel()
	g, err := c.Grant(cctx, int64(l.ttl/time.Second))
	if err != nil {
		return false, l.store.explain(err)
	}
	if err := os.MkdirAll(filepath.Dir(l.file), 0o700); err != nil {
		return false, err
	}
	if err := atomicfile.WriteFile(l.file, []byte(fmt.Sprintf("%x\n", int64(g.ID))), 0o600); err != nil {
		return false, err
	}
	l.set(g.ID)
	return false, nil
}

func (l *lease) set(id clientv3.LeaseID) {
	l.mu.Lock()
	l.id, l.lastRenew, l.lastOK = id, time.Now(), time.Now()
	l.mu.Unlock()
}

// renewed is when the last renewal etcd confirmed was sent.
func (l *lease) renewed() time.Time {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.lastOK
}

func (l *lease) get() (clientv3.LeaseID, time.Time) {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.id, l.lastRenew
}

// renew keeps the lease once; errLeaseGone means it expired. It may take
// up to two thirds of the TTL: on a loaded host etcd answers late, and the
// watchdog fences on its own clock anyway. A renewal counts from when it
// was sent (the leader renews on receipt): a late answer never moves the
// fence point past the lease's real expiry. It reports the lease it renewed
// and when it sent the renewal, so that a late answer about a lease since
// replaced, or older than a success, is told apart.
func (l *lease) renew(ctx context.Context) (renewal, error) {
	id, _ := l.get()
	r := renewal{id: id, sent: time.Now()}
	cctx, cancel := context.WithTimeout(ctx, l.ttl*2/3)
	defer cancel()
	_, err := l.store.Client().KeepAliveOnce(cctx, id)
	if err == nil {
		l.hold(r.sent)
		l.mu.Lock()
		if r.sent.After(l.lastOK) {
			l.lastOK = r.sent
		}
		l.mu.Unlock()
		return r, nil
	}
	if errors.Is(err, rpctypes.ErrLeaseNotFound) {
		return r, errLeaseGone
	}
	return r, l.store.explain(err)
}

type renewal struct {
	id   clientv3.LeaseID
	sent time.Time
}

// hold moves the last renewal to t if t is later: a renewal sent at t, or
// "no leader" seen by a probe sent at t (the next leader gives every lease
// a full TTL from its election, which is later than t).
func (l *lease) hold(t time.Time) {
	l.mu.Lock()
	if t.After(l.lastRenew) {
		l.lastRenew = t
	}
	l.mu.Unlock()
}

// current is the lease held now.
func (l *lease) current() clientv3.LeaseID {
	id, _ := l.get()
	return id
}

var errLeaseGone = errors.New("the host's lease expired")
