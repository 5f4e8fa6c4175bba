package fleet

import (
	"cmp"
	"context"
	"crypto/tls"
	"errors"
	"fmt"
	"log/slog"
	"net"
	"os"
	"path/filepath"
	"sync"
	"sync/atomic"
	"time"

	clientv3 "go.etcd.io/etcd/client/v3"
	"go.etcd.io/etcd/client/v3/concurrency"

	"github.com/vmsup/vmsup/fleet/guard"
	"github.com/vmsup/vmsup/supervisor"
)

// Agent is the fleet's one resident process per host (vmsup agent): it
// keeps the host registered under its lease, runs the VMs placed on the
// host through the supervisor library (up, apply, migrate, down), reports
// their state, and takes its turn as the scheduler when elected. It keeps
// no state a restart would lose: the VMs run in their systemd units, the
// lease ID and the VMs it manages are files under StateDir, so a new agent
// re-adopts all of them.
type Agent struct {
	Store *Store
	Sup   Supervisor
	Host  Host   // Name, CPUs, Memory, Labels, Migration: what it registers
	State string // its directory (ROOT/fleet)
	// TTL of the host's lease (default 10 s); the agent fences itself
	// SelfFenceMargin (default 3 s) before it would expire.
	TTL, SelfFenceMargin time.Duration
	// Guard, when set, is the host's fence that outlives the agent: a
	// systemd timer, moved forward at each renewal, that kills the fleet
	// VMs when the agent, frozen or gone, does not fence itself.
	Guard *guard.Guard
	// Listener, when set, takes other agents' migrations and questions
	// (mutual TLS: ServerTLS); ClientTLS asks other agents (PeerTLS).
	Listener             net.Listener
	ServerTLS, ClientTLS *tls.Config
	// StallAfter: a running VM whose disk requests stay in flight this
	// long with none ending is reported degraded (0: iohealth's default).
	StallAfter time.Duration
	// FailoverStalled, when positive, lets this agent's scheduler restart
	// elsewhere (after fencing) a VM reported degraded by stalled I/O for
	// that long; 0: it is only reported.
	FailoverStalled time.Duration
	// Fence, when set, lets this agent's scheduler restart a lost host's VMs.
	Fence Fencer
	// Connect is the transport to another agent's migration port
	// (`vmsup fleet migrate-connect ADDR`), for hosts that register one.
	Connect func(receiver string) []string
	Log     *slog.Logger
	// Images, when set, is this host's image store: a VM placed here
	// whose images it lacks gets them pulled by digest before its start.
	Images ImageStore
	// Decided, when set, gets each placement decision's duration.
	Decided func(vm string, d time.Duration)

	lease   *lease
	promise *promise   // not to fail hosts over, given to peers
	retry   retries    // VMs whose start, apply or migration failed
	waits   imageWaits // drains waiting for their target to pull images
	health  health     // the running VMs' disk I/O
	known   knowledge  // peers and incoming VMs, from the last read of the fleet
	members memberView // the last look at etcd's members, to answer peers with
	poke    chan struct{}
	mu      sync.Mutex
	fenced  bool
	cancel  context.CancelFunc // the reconcile pass running, cancelled by a self-fence
	fresh   atomic.Bool        // a renewal on a fresh connection is in flight (renewFresh)
	record  Host               // as last put in etcd (register, publishImages)
}

// Run registers the host and works until ctx ends; only a failure to
// register at all is an error.
func (a *Agent) Run(ctx context.Context) error {
	a.init()
	if err := a.register(ctx); err != nil {
		return err
	}
	var wg sync.WaitGroup
	if a.Listener != nil {
		wg.Go(func() { a.serve(ctx) })
	}
	wg.Go(func() { a.keepAlive(ctx) })
	wg.Go(func() { a.watchdog(ctx) })
	wg.Go(func() { a.guardLoop(ctx) })
	wg.Go(func() { a.healthLoop(ctx) })
	wg.Go(func() { a.schedule(ctx) })
	a.reconcileLoop(ctx)
	wg.Wait()
	return nil
}

// init sets the defaults and the agent's own state.
func (a *Agent) init() {
	if a.TTL == 0 {
		a.TTL = 10 * time.Second
	}
	if a.SelfFenceMargin == 0 {
		a.SelfFenceMargin = 3 * time.Second
	}
	if a.Log == nil {
		a.Log = slog.Default()
	}
	a.lease = &lease{store: a.Store, file: filepath.Join(a.State, "lease"), ttl: a.TTL}
	a.promise = loadPromise(filepath.Join(a.State, "failover-hold"))
	a.health.bound = a.StallAfter
	a.poke = make(chan struct{}, 1)
}

// register takes the lease (the old one after a restart) and puts the host
// record under it, unless another live agent holds the name.
func (a *Agent) register(ctx context.Context) error {
	reused, err := a.lease.acquire(ctx)
	if err != nil {
		return fmt.Errorf("host %s: lease: %w", a.Host.Name, err)
	}
	id, _ := a.lease.get()
	h := a.Host
	h.Lease, h.Started, h.Images = int64(id), time.Now().UTC(), a.storeDigests()
	k := a.Store.key("hosts", h.Name)
	put := clientv3.OpPut(k, mustJSON(h), clientv3.WithLease(id))
	cctx, cancel := a.Store.ctx(ctx)
	defer cancel()
	r, err := a.Store.Client().Txn(cctx).If(clientv3.Compare(clientv3.CreateRevision(k), "=", 0)).Then(put).
		Else(clientv3.OpTxn([]clientv3.Cmp{clientv3.Compare(clientv3.LeaseValue(k), "=", id)}, []clientv3.Op{put}, nil)).Commit()
	if err != nil {
		return fmt.Errorf("host %s: register: %w", h.Name, a.Store.explain(err))
	}
	if !r.Succeeded && !r.Responses[0].GetResponseTxn().Succeeded {
		return fmt.Errorf("host %s: another live agent holds this host's name in the fleet (its lease has not expired)", h.Name)
	}
	a.mu.Lock()
	a.record = h
	a.mu.Unlock()
	a.Log.Info("registered", "host", h.Name, "lease", fmt.Sprintf("%x", int64(id)), "reused", reused)
	return nil
}

// keepAlive renews the lease every TTL/3. While renewals fail it sends one
// every second beside those still waiting (up to 4): a renewal stuck on a
// member that had no leader must not hold back the one a new leader would
// answer at once (found by the full suite: an agent fenced itself seconds
// after quorum came back). A lease found expired fences the host and
// registers it anew.
func (a *Agent) keepAlive(ctx context.Context) {
	type answer struct {
		r   renewal
		err error
	}
	answers := make(chan answer, 4)
	waiting, failing := 0, false
	var lastOK time.Time // when the last renewal that succeeded was sent
	next := time.NewTimer(0)
	defer next.Stop()
	for {
		select {
		case <-ctx.Done():
			return
		case <-next.C:
			if waiting < cap(answers) {
				waiting++
				go func() {
					r, err := a.lease.renew(ctx)
					answers <- answer{r, err}
				}()
			}
			next.Reset(time.Second) // no answer within a second: send another
			continue
		case ans := <-answers:
			waiting--
			switch {
			case ans.err == nil:
				failing, lastOK = false, ans.r.sent
				a.unfence()
				next.Reset(a.TTL / 3)
			case ans.r.id != a.lease.current() || ans.r.sent.Before(lastOK):
				// a late answer about a lease since replaced, or older than a success
			case errors.Is(ans.err, errLeaseGone):
				// Expired: the scheduler may have moved our VMs already.
				a.selfFence(ctx, "the host's lease expired")
				if err := a.register(ctx); err == nil {
					a.unfence()
					next.Reset(a.TTL / 3)
				}
			case !failing:
				failing = true
				a.Log.Warn("lease renewal failed", "err", ans.err)
			}
		}
	}
}

// watchdog fences the host at TTL - SelfFenceMargin after the last
// renewal, on its own clock: a renewal stuck on a dead network must not
// delay it. Only knowing that no scheduler can act on a lapse of the lease
// holds it off (mayHold: etcd has no leader, or no peer reaches etcd
// either), and then the count starts again from when that was asked (the
// next leader gives every lease a full TTL). While renewals fail it asks
// every half second until the fence point, in the background; at the fence
// point it waits for the question in flight, and for a renewal a probe
// started (renewFresh), at most decisionBound: the margin must leave more
// than that, and the guard's slack, before the lease can expire.
func (a *Agent) watchdog(ctx context.Context) {
	tick := time.NewTicker(100 * time.Millisecond)
	defer tick.Stop()
	type probe struct {
		sent time.Time
		hold bool
		why  string
	}
	answers := make(chan probe, 1)
	probing, holding := false, false
	var probed time.Time
	var whyNot string // the last answer's, when it did not hold
	for {
		select {
		case <-ctx.Done():
			return
		case p := <-answers:
			probing = false
			if p.hold {
				a.lease.hold(p.sent)
				if !holding {
					a.Log.Warn("lease renewals fail; the VMs run on", "why", p.why)
				}
			}
			holding = p.hold
			if !p.hold {
				whyNot = p.why
			}
		case <-tick.C:
		}
		if time.Since(a.lease.renewed()) < a.TTL/3+time.Second {
			holding = false
		}
		_, last := a.lease.get()
		if a.isFenced() || time.Since(last) < a.TTL/3+time.Second {
			continue // renewing as it should
		}
		due := last.Add(a.TTL - a.SelfFenceMargin)
		if !probing && time.Since(probed) >= 500*time.Millisecond && time.Now().Before(due) {
			probing, probed = true, time.Now()
			go func(sent time.Time) {
				hold, why := a.mayHold(ctx)
				if !hold {
					go a.renewFresh(ctx)
				}
				answers <- probe{sent, hold, why}
			}(probed)
		}
		if !probing && time.Now().After(due) {
			if a.fresh.Load() && time.Now().Before(due.Add(decisionBound)) {
				// A renewal a probe started is in flight and may yet hold
				// (CI fenced a host 176 ms before one did): waited for as a
				// question in flight is, up to decisionBound, which the
				// margin and the guard's slack leave room for.
				continue
			}
			a.selfFence(ctx, fmt.Sprintf("no lease renewal for %s; %s", time.Since(last).Round(time.Millisecond), cmp.Or(whyNot, "no answer in time")))
		}
	}
}

// renewFresh renews the lease on a connection whose reconnect backoff is
// reset, once a probe found that the host may not hold: etcd that others
// reach again answers a fresh call at once, while the keep-alive's renewals
// in flight may still wait on the outage's connections (a host fenced itself
// 160 ms before the renewal that would have held; TestWatchdogQuorum). The
// fence point does not move: a renewal that succeeds moves it, as any.
func (a *Agent) renewFresh(ctx context.Context) {
	if !a.fresh.CompareAndSwap(false, true) {
		return
	}
	defer a.fresh.Store(false)
	if cc := a.Store.Client().ActiveConnection(); cc != nil {
		cc.ResetConnectBackoff()
	}
	if _, err := a.lease.renew(ctx); err == nil {
		a.unfence()
	}
}

func (a *Agent) isFenced() bool {
	a.mu.Lock()
	defer a.mu.Unlock()
	return a.fenced
}

func (a *Agent) unfence() {
	a.mu.Lock()
	was := a.fenced
	a.fenced = false
	a.mu.Unlock()
	if was {
		a.Log.Info("lease renewed: reconciling again")
	}
}

// selfFence stops every VM this agent manages, at once (SIGKILL: it must
// beat the lease's expiry), and holds reconciling until the lease is back.
func (a *Agent) selfFence(ctx context.Context, why string) {
	a.mu.Lock()
	if a.fenced {
		a.mu.Unlock()
		return
	}
	a.fenced = true
	if a.cancel != nil {
		a.cancel()
	}
	a.mu.Unlock()
	names, _ := a.managed()
	a.Log.Warn("self-fence: stopping this host's fleet VMs", "why", why, "vms", names)
	for _, name := range names {
		if _, err := a.Sup.Kill(context.WithoutCancel(ctx), name); err != nil && !errors.Is(err, supervisor.ErrNotFound) {
			a.Log.Error("self-fence", "vm", name, "err", err)
		}
	}
}

// schedule campaigns for the scheduler's role and, while it holds it, runs
// a pass after each change of the fleet and every second.
func (a *Agent) schedule(ctx context.Context) {
	s := &Scheduler{Store: a.Store, Log: a.Log, Fence: a.Fence, Decided: a.Decided, Hold: a.promise.until, FailoverStalled: a.FailoverStalled}
	for ctx.Err() == nil {
		sess, err := concurrency.NewSession(a.Store.Client(), concurrency.WithTTL(int(a.TTL/time.Second)), concurrency.WithContext(ctx))
		if err != nil {
			sleep(ctx, time.Second)
			continue
		}
		el := concurrency.NewElection(sess, a.Store.prefix+"leader")
		if err := el.Campaign(ctx, a.Host.Name); err != nil {
			sess.Close()
			sleep(ctx, time.Second)
			continue
		}
		a.Log.Info("elected scheduler")
		s.leads(el)
		a.watchLoop(ctx, sess.Done(), nil, func(ctx context.Context) {
			if err := s.Pass(ctx); err != nil {
				a.Log.Warn("schedule", "err", err)
			}
		})
		sess.Close()
	}
}

// reconcileLoop runs reconcile after each change of the fleet, when poked
// (a VM's disk I/O verdict changed) and every two seconds (the VMs' own
// changes: a guest that powered off).
func (a *Agent) reconcileLoop(ctx context.Context) {
	a.watchLoop(ctx, nil, a.poke, func(ctx context.Context) {
		if a.isFenced() {
			return
		}
		pctx, cancel := context.WithCancel(ctx)
		a.mu.Lock()
		a.cancel = cancel
		a.mu.Unlock()
		if err := a.reconcile(pctx); err != nil {
			a.Log.Warn("reconcile", "err", err)
		}
		if err := a.publishImages(pctx); err != nil {
			a.Log.Warn("images", "err", err)
		}
		cancel()
	})
}

// watchLoop calls pass now, after each change under the fleet's prefix
// (coalesced), on each poke and every 2 s, until ctx or stop ends.
func (a *Agent) watchLoop(ctx context.Context, stop, poke <-chan struct{}, pass func(context.Context)) {
	wctx, cancel := context.WithCancel(clientv3.WithRequireLeader(ctx))
	defer cancel()
	w := a.Store.Client().Watch(wctx, a.Store.prefix, clientv3.WithPrefix())
	tick := time.NewTicker(2 * time.Second)
	defer tick.Stop()
	for {
		select {
		case <-stop: // checked first: select picks among ready cases at random
			return
		default:
		}
		pass(ctx)
		select {
		case <-ctx.Done():
			return
		case <-stop:
			return
		case <-tick.C:
		case <-poke:
		case _, ok := <-w:
			if !ok { // etcd lost its leader, or the client its members
				sleep(ctx, time.Second)
				w = a.Store.Client().Watch(wctx, a.Store.prefix, clientv3.WithPrefix())
			}
		}
	}
}

func sleep(ctx context.Context, d time.Duration) {
	select {
	case <-ctx.Done():
	case <-time.After(d):
	}
}

// managed lists the VMs this host's agent runs for the fleet (its marks).
func (a *Agent) managed() ([]string, error) {
	ents, err := os.ReadDir(filepath.Join(a.State, "vms"))
	if err != nil && !os.IsNotExist(err) {
		return nil, err
	}
	var out []string
	for _, e := range ents {
		out = append(out, e.Name())
	}
	return out, nil
}
