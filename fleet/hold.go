package fleet

import (
	"context"
	"fmt"
	"maps"
	"os"
	"slices"
	"strings"
	"sync"
	"time"

	"github.com/vmsup/vmsup/fleet/peer"
	"github.com/vmsup/vmsup/internal/util/atomicfile"
)

// The rule that keeps VMs running when etcd is down for everyone, and
// fences a host that is cut off. A host's lease lapsing only matters if a
// scheduler (an agent that reaches etcd) acts on it; so an agent whose
// renewals fail holds its fence off only while it knows none can:
//
//   - a majority of etcd's members answer it and none has a leader (no
//     lease can lapse without one), or
//   - every other host of the fleet (those its last read listed, and any
//     gone for less than peerMemory) answers it on the peer port, and none
//     reaches etcd (and each, by answering so, promises to fail no host
//     over for a TTL: by then the asker has fenced itself if it had to).
//
// Anything else fences at the fence point: no etcd and no peer (cut off),
// a peer that does not answer (it may be a scheduler that reaches etcd),
// a peer that reaches etcd.

// decisionBound is how long the agent may wait, past its fence point, for
// the answers that could hold the fence off.
const decisionBound = time.Second

// peerProbe bounds an agent's look at etcd when a peer asks: short enough
// that the answer arrives within the asker's decisionBound.
const peerProbe = 600 * time.Millisecond

// mayHold asks etcd's members and the peers at once whether no scheduler
// can act on a lapse of this host's lease, and why (or why not).
func (a *Agent) mayHold(ctx context.Context) (bool, string) {
	type members struct{ answered, leaderless int }
	ch := make(chan members, 1)
	go func() {
		an, ll := a.Store.askMembers(ctx, decisionBound)
		a.members.set(an, ll)
		ch <- members{an, ll}
	}()
	cut, why := a.peersCutToo(ctx)
	m := <-ch
	n := len(a.Store.Client().Endpoints())
	switch {
	case m.leaderless > n/2:
		return true, fmt.Sprintf("etcd has no leader (%d of %d members say so): no lease can lapse", m.leaderless, n)
	case m.answered > m.leaderless:
		return false, fmt.Sprintf("%d of %d etcd members answer with a leader: the lease can lapse", m.answered-m.leaderless, n)
	}
	return cut, why
}

// peersCutToo reports whether every peer answered, each saying it does not
// reach etcd either.
func (a *Agent) peersCutToo(ctx context.Context) (bool, string) {
	peers, ok := a.known.peers()
	switch {
	case !ok:
		return false, "no etcd member answers, and the peers are not known yet"
	case len(peers) > 0 && a.ClientTLS == nil:
		return false, "no etcd member answers, and this agent cannot ask its peers (no peer port)"
	}
	for name, addr := range peers {
		if addr == "" {
			return false, "no etcd member answers, and peer " + name + " has no port to be asked on"
		}
	}
	answers, errs := peer.AskAll(ctx, peer.ClientConfig(a.ClientTLS), peers, decisionBound)
	if len(errs) > 0 {
		name := slices.Min(slices.Collect(maps.Keys(errs)))
		return false, fmt.Sprintf("no etcd member answers, nor peer %s (%d of %d peers do not): cut off? %v", name, len(errs), len(peers), errs[name])
	}
	for name, ans := range answers {
		if ans.Etcd != peer.Unreachable && ans.Etcd != peer.Leaderless {
			return false, fmt.Sprintf("no etcd member answers, but peer %s says etcd is %s to it", name, ans.Etcd)
		}
		for _, other := range ans.Peers {
			if _, asked := peers[other]; !asked && other != a.Host.Name {
				return false, fmt.Sprintf("no etcd member answers, and peer %s knows host %s, which this agent does not", name, other)
			}
		}
	}
	names := slices.Sorted(maps.Keys(peers))
	return true, fmt.Sprintf("no etcd member answers this host, and none answers its %d peers (%s): no scheduler can act",
		len(peers), strings.Join(names, ","))
}

// answer is what this agent tells a peer that asks: what it knows of etcd
// now. Saying it does not reach etcd is a promise to fail no host over for
// a TTL.
func (a *Agent) answer(ctx context.Context) peer.Answer {
	ans := peer.Answer{Host: a.Host.Name, Etcd: peer.Reachable}
	if time.Since(a.lease.renewed()) > time.Second {
		// What this agent's own probe saw (it probes every half second
		// while its renewals fail) answers at once: asking the members
		// again cost the asker's whole decisionBound on a loaded host.
		answered, leaderless, fresh := a.members.fresh(memberViewAge)
		if !fresh {
			answered, leaderless = a.Store.askMembers(ctx, peerProbe)
			a.members.set(answered, leaderless)
		}
		switch {
		case answered == 0:
			ans.Etcd = peer.Unreachable
		case leaderless == answered:
			ans.Etcd = peer.Leaderless
		}
	}
	if ans.Etcd != peer.Reachable {
		ans.HoldUntil = a.promise.extend(a.TTL)
	}
	peers, _ := a.known.peers()
	ans.Peers = slices.Sorted(maps.Keys(peers))
	return ans
}

// memberViewAge is how old the agent's last look at etcd's members may be
// to answer a peer with.
const memberViewAge = 1500 * time.Millisecond

// memberView is the agent's last look at etcd's members.
type memberView struct {
	mu                   sync.Mutex
	answered, leaderless int
	at                   time.Time
}

func (m *memberView) set(answered, leaderless int) {
	m.mu.Lock()
	defer m.mu.Unlock()
	m.answered, m.leaderless, m.at = answered, leaderless, time.Now()
}

// fresh is the last look if it is younger than age.
func (m *memberView) fresh(age time.Duration) (answered, leaderless int, ok bool) {
	m.mu.Lock()
	defer m.mu.Unlock()
	return m.answered, m.leaderless, !m.at.IsZero() && time.Since(m.at) < age
}

// promise is the time before which this agent's scheduler fails no host
// over: what it promised peers it told that etcd did not answer it. It is
// kept in a file, so a restarted agent keeps it.
type promise struct {
	file string
	mu   sync.Mutex
	at   time.Time
}

func loadPromise(file string) *promise {
	p := &promise{file: file}
	if b, err := os.ReadFile(file); err == nil {
		p.at, _ = time.Parse(time.RFC3339Nano, strings.TrimSpace(string(b)))
	}
	return p
}

// extend makes the promise last at least d from now; it returns its end.
func (p *promise) extend(d time.Duration) time.Time {
	p.mu.Lock()
	defer p.mu.Unlock()
	if t := time.Now().Add(d); t.After(p.at) {
		p.at = t
		// Written before the answer goes out; a failure to write still
		// leaves it in memory, which this process honours.
		_ = atomicfile.WriteFile(p.file, []byte(t.UTC().Format(time.RFC3339Nano)+"\n"), 0o600)
	}
	return p.at
}

// until is the promise's end (zero: none).
func (p *promise) until() time.Time {
	p.mu.Lock()
	defer p.mu.Unlock()
	return p.at
}

// knowledge is what the agent learnt from its reads of the fleet: its
// peers (name -> peer port) and the VMs a drain moves to this host.
type knowledge struct {
	mu       sync.Mutex
	read     bool
	peerAddr map[string]seenPeer
	incoming []string
}

// seenPeer is a peer's port and when a read of the fleet last listed it.
type seenPeer struct {
	addr string
	seen time.Time
}

// peerMemory is how long a host that left the fleet (its lease lapsed) is
// still asked: it may be back, and its scheduler able to act, before this
// agent reads the fleet again. (Found by the fleet tests: a host cut just
// after its peer came back from a cut of its own knew no peer, held its
// fence off, and its VM ran on two hosts.)
const peerMemory = 10 * time.Minute

// learn keeps what later decisions need from a read of the fleet.
func (a *Agent) learn(snap *Snapshot) {
	now := time.Now()
	a.known.mu.Lock()
	defer a.known.mu.Unlock()
	peers := map[string]seenPeer{}
	for name, p := range a.known.peerAddr {
		if now.Sub(p.seen) < peerMemory {
			peers[name] = p
		}
	}
	for name, h := range snap.Hosts {
		if name != a.Host.Name {
			peers[name] = seenPeer{h.Migration.Receiver, now}
		}
	}
	var incoming []string
	for name, p := range snap.Placements {
		if p.Value.Target == a.Host.Name {
			incoming = append(incoming, name)
		}
	}
	slices.Sort(incoming)
	a.known.read, a.known.peerAddr, a.known.incoming = true, peers, incoming
}

// peers are the other hosts' peer ports, those the last read listed and
// those gone for less than peerMemory; ok is false before the first read.
func (k *knowledge) peers() (map[string]string, bool) {
	k.mu.Lock()
	defer k.mu.Unlock()
	m := map[string]string{}
	for name, p := range k.peerAddr {
		m[name] = p.addr
	}
	return m, k.read
}

func (k *knowledge) incomingVMs() []string {
	k.mu.Lock()
	defer k.mu.Unlock()
	return slices.Clone(k.incoming)
}
