package fleet

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"path"
	"slices"
	"strings"
	"sync"
	"time"

	pb "go.etcd.io/etcd/api/v3/etcdserverpb"
	clientv3 "go.etcd.io/etcd/client/v3"
	"google.golang.org/grpc"
	"google.golang.org/grpc/backoff"

	"github.com/vmsup/vmsup/internal/observe/iohealth"
	"github.com/vmsup/vmsup/supervisor"
)

// The fleet's state in etcd, under one prefix (default "/vmsup/"):
//
//	PREFIX/vms/NAME        VMRecord: the spec (its TOML) and its generation
//	PREFIX/placement/NAME  Placement: the host that owns the VM (compare-and-swap only)
//	PREFIX/status/NAME     Status: what the owning agent (or the scheduler) last saw
//	PREFIX/hosts/HOST      Host: a live agent, under its lease
//	PREFIX/cordon/HOST     a drained host: it takes no new VMs (no lease: it outlives agents)
//	PREFIX/leader/         the scheduler's election
//
// Nothing vmsup-specific runs in etcd: any etcd cluster does.

// VMRecord is one VM's desired state.
type VMRecord struct {
	Name       string `json:"name"`
	File       string `json:"file"` // the path it was applied from: messages, and relative paths in the TOML
	TOML       string `json:"toml"`
	Generation int64  `json:"generation"` // +1 at each apply that changes the TOML
	// Images are the stored images its file disks stand on, as the
	// applying host resolved them (ResolveImages): hosts that lack one
	// pull it by digest before the VM's start.
	Images []ImageRef `json:"images,omitempty"`
}

// Placement is the VM's owner. Epoch goes up each time the owner changes,
// so a stale agent's write (a compare on the key's revision) fails.
type Placement struct {
	Host   string `json:"host"`
	Target string `json:"target,omitempty"` // a drain moves it there (live migration)
	// FailedTargets are the hosts a drain's migration failed to: the next
	// target is another host if one fits.
	FailedTargets []string `json:"failed_targets,omitempty"`
	Epoch         int64    `json:"epoch"`
}

// Status is a VM's real state as last reported.
type Status struct {
	Host   string `json:"host,omitempty"`
	State  State  `json:"state"`
	Reason string `json:"reason,omitempty"`
	// IO is what its host's check of its disk I/O found while it runs
	// (omitted: fine); State is StateDegraded when it is not.
	IO         iohealth.State `json:"io,omitempty"`
	Generation int64          `json:"generation,omitempty"` // of the spec running
	Updated    time.Time      `json:"updated"`
}

// State is a fleet VM's state: its QEMU's as the host's supervisor says
// (running, paused, shut off, crashed...), or one of the fleet's own.
type State string

// Fleet states beyond the supervisor's own.
const (
	StateRunning             = State(supervisor.StateRunning)
	StateFailed        State = "failed"        // its host could not start or apply it: Reason says why
	StateUnknown       State = "unknown"       // its host cannot tell: Reason says why
	StateRemoving      State = "removing"      // fleet rm: its host stops it
	StatePending       State = "pending"       // not placed yet
	StateUnschedulable State = "unschedulable" // no host fits: Reason says why
	StateMigrating     State = "migrating"     // a drain moves it
	StateInvalid       State = "invalid"       // the owning host refuses the spec: Reason is the one-line error
	StateLost          State = "lost"          // its host's lease expired and it is not restarted elsewhere: Reason says why
	// StateDegraded: it runs, but its disk I/O stalls or fails (Reason
	// names the disk); IO says which.
	StateDegraded State = "degraded"
)

// Host is a live agent's host, registered under its lease.
type Host struct {
	Name      string            `json:"name"`
	CPUs      int               `json:"cpus"`   // vCPUs it offers
	Memory    int64             `json:"memory"` // bytes it offers to guests
	Labels    map[string]string `json:"labels,omitempty"`
	Draining  bool              `json:"draining,omitempty"` // from PREFIX/cordon, not stored here
	Migration Endpoint          `json:"migration"`
	// Images are the digests its image store holds, as its agent last
	// saw them: placement prefers a host that need not pull a VM's.
	Images  []string  `json:"images,omitempty"`
	Lease   int64     `json:"lease"`
	Started time.Time `json:"started"` // the agent's start
}

// Endpoint is how another host's vmsup migrates a VM to this one: the
// address QEMU's stream goes to and the command that runs `vmsup
// migrate-receive` here (e.g. ssh HOST vmsup migrate-receive).
type Endpoint struct {
	Address   string   `json:"address,omitempty"`
	Receiver  string   `json:"receiver,omitempty"`  // the agent's migration port (ADDR:PORT, mutual TLS)
	Transport []string `json:"transport,omitempty"` // instead of the port: a command, e.g. ssh HOST vmsup migrate-receive
}

// Store reads and writes the fleet's keys; every call is bounded by
// Timeout, so a fleet without quorum answers with an error, not a hang.
type Store struct {
	c       *clientv3.Client
	prefix  string
	Timeout time.Duration

	mu    sync.Mutex
	conns map[string]*grpc.ClientConn // one per member, for status probes
}

// DialOptions are the gRPC options for the fleet's etcd clients: after an
// outage of etcd, a client reconnects within a second of its return (gRPC's
// default backoff grows to two minutes, so after a 30 s outage an agent
// could stay away for ~15 s more, past its fence point, though its lease
// was renewed by the new leader).
func DialOptions() []grpc.DialOption {
	return []grpc.DialOption{grpc.WithConnectParams(grpc.ConnectParams{
		Backoff:           backoff.Config{BaseDelay: 200 * time.Millisecond, Multiplier: 1.6, Jitter: 0.2, MaxDelay: time.Second},
		MinConnectTimeout: 2 * time.Second,
	})}
}

// NewStore uses c with keys under prefix ("" means "/vmsup/").
func NewStore(c *clientv3.Client, prefix string) *Store {
	if prefix == "" {
		prefix = "/vmsup/"
	}
	if !strings.HasSuffix(prefix, "/") {
		prefix += "/"
	}
	return &Store{c: c, prefix: prefix, Timeout: 5 * time.Second}
}

// Client is the etcd client under the store.
func (s *Store) Client() *clientv3.Client { return s.c }

func (s *Store) key(kind, name string) string { return s.prefix + kind + "/" + name }
func (s *Store) dir(kind string) string       { return s.prefix + kind + "/" }

// ctx bounds one call.
func (s *Store) ctx(ctx context.Context) (context.Context, context.CancelFunc) {
	return context.WithTimeout(ctx, s.Timeout)
}

// Entry is a value with the revision the compare-and-swaps use.
type Entry[T any] struct {
	Value T
	Rev   int64 // ModRevision; 0: no such key
}

// Snapshot is the whole fleet at one etcd revision.
type Snapshot struct {
	Rev        int64
	VMs        map[string]Entry[VMRecord]
	Placements map[string]Entry[Placement]
	Statuses   map[string]Entry[Status]
	Hosts      map[string]Host
	Cordoned   map[string]bool
}

// ErrNoQuorum is returned (wrapped) when etcd cannot serve a linearizable
// request; a serializable read may still answer.
var ErrNoQuorum = errors.New("etcd has no quorum")

// Load reads the whole fleet in one transaction-consistent read. With
// serializable set it reads from whichever member answers (a possibly stale
// view, for `fleet ls` when etcd has lost quorum).
func (s *Store) Load(ctx context.Context, serializable bool) (*Snapshot, error) {
	ctx, cancel := s.ctx(ctx)
	defer cancel()
	opts := []clientv3.OpOption{clientv3.WithPrefix()}
	if serializable {
		opts = append(opts, clientv3.WithSerializable())
	}
	r, err := s.c.Get(ctx, s.prefix, opts...)
	if err != nil {
		return nil, s.explain(err)
	}
	snap := &Snapshot{Rev: r.Header.Revision, VMs: map[string]Entry[VMRecord]{}, Placements: map[string]Entry[Placement]{},
		Statuses: map[string]Entry[Status]{}, Hosts: map[string]Host{}, Cordoned: map[string]bool{}}
	for _, kv := range r.Kvs {
		kind, name := path.Split(strings.TrimPrefix(string(kv.Key), s.prefix))
		var err error
		switch kind {
		case "vms/":
			err = decode(kv.Value, kv.ModRevision, snap.VMs, name)
		case "placement/":
			err = decode(kv.Value, kv.ModRevision, snap.Placements, name)
		case "status/":
			err = decode(kv.Value, kv.ModRevision, snap.Statuses, name)
		case "hosts/":
			var h Host
			if err = json.Unmarshal(kv.Value, &h); err == nil {
				snap.Hosts[name] = h
			}
		case "cordon/":
			snap.Cordoned[name] = true
		}
		if err != nil {
			return nil, fmt.Errorf("etcd key %s: %w", kv.Key, err)
		}
	}
	for name, h := range snap.Hosts {
		h.Draining = snap.Cordoned[name]
		snap.Hosts[name] = h
	}
	return snap, nil
}

func decode[T any](b []byte, rev int64, into map[string]Entry[T], name string) error {
	var v T
	if err := json.Unmarshal(b, &v); err != nil {
		return err
	}
	into[name] = Entry[T]{Value: v, Rev: rev}
	return nil
}

// ErrUnreachable is returned (wrapped) when no etcd member answers.
var ErrUnreachable = errors.New("no etcd member answers")

// explain names what a timed-out request met: no member that answers
// (ErrUnreachable), or members without a leader (ErrNoQuorum).
func (s *Store) explain(err error) error {
	if err == nil {
		return nil
	}
	if !errors.Is(err, context.DeadlineExceeded) && !strings.Contains(err.Error(), "no leader") {
		return err
	}
	answered, leaderless := s.askMembers(context.Background(), time.Second)
	eps := s.c.Endpoints()
	switch {
	case answered == 0:
		return fmt.Errorf("%w at %s", ErrUnreachable, strings.Join(eps, ","))
	case answered > leaderless:
		return err // a member with a leader: a plain timeout
	}
	return fmt.Errorf("%w: %d of %d members answer, none has a leader; nothing can be placed or moved until a majority is back", ErrNoQuorum, answered, len(eps))
}

// askMembers asks every member for its status at once, all within d: how
// many answered, and how many of those know no leader. Both the errors'
// wording (explain) and the self-fence's exception (lease.noLeader) rest
// on it.
func (s *Store) askMembers(ctx context.Context, d time.Duration) (answered, leaderless int) {
	ctx, cancel := context.WithTimeout(ctx, d)
	defer cancel()
	eps := s.c.Endpoints()
	type answer struct{ ok, leaderless bool }
	ch := make(chan answer, len(eps))
	for _, ep := range eps {
		go func() {
			var st *pb.StatusResponse
			conn, err := s.memberConn(ep)
			if err == nil {
				st, err = pb.NewMaintenanceClient(conn).Status(ctx, &pb.StatusRequest{})
			}
			ch <- answer{err == nil, err == nil && st.Leader == 0}
		}()
	}
	for range eps {
		a := <-ch
		if a.ok {
			answered++
		}
		if a.leaderless {
			leaderless++
		}
	}
	return answered, leaderless
}

// memberConn is a connection to one member, kept for the client's life.
// clientv3's Maintenance.Status dials a new one on every call: a TCP and TLS
// handshake per member per question, which on a loaded host took longer
// than the self-fence's probe may (the watchdog then missed that etcd had
// no leader, and an agent fenced itself for nothing).
func (s *Store) memberConn(ep string) (*grpc.ClientConn, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	if err := s.c.Ctx().Err(); err != nil {
		return nil, err // closed: a new connection would outlive it
	}
	if c, ok := s.conns[ep]; ok {
		return c, nil
	}
	c, err := s.c.Dial(ep)
	if err != nil {
		return nil, err
	}
	if s.conns == nil {
		s.conns = map[string]*grpc.ClientConn{}
		go func() {
			<-s.c.Ctx().Done()
			s.mu.Lock()
			defer s.mu.Unlock()
			for _, c := range s.conns {
				c.Close()
			}
		}()
	}
	s.conns[ep] = c
	return c, nil
}

func mustJSON(v any) string {
	b, err := json.Marshal(v)
	if err != nil {
		panic(err) // only our own plain records are marshalled
	}
	return string(b)
}

// cas commits ops only if every key in revs still has its revision (0: the
// key must not exist) and every comparison in guard holds (the scheduler's
// leadership). It reports whether it committed; with no ops it only checks.
func (s *Store) cas(ctx context.Context, revs map[string]int64, guard []clientv3.Cmp, ops ...clientv3.Op) (bool, error) {
	ctx, cancel := s.ctx(ctx)
	defer cancel()
	cmps := slices.Clone(guard)
	for k, rev := range revs {
		cmps = append(cmps, clientv3.Compare(clientv3.ModRevision(k), "=", rev))
	}
	r, err := s.c.Txn(ctx).If(cmps...).Then(ops...).Commit()
	if err != nil {
		return false, s.explain(err)
	}
	return r.Succeeded, nil
}

// PutStatus records a VM's status (unconditionally: the owner or the
// scheduler writes it, and each write is a whole state).
func (s *Store) PutStatus(ctx context.Context, name string, st Status) error {
	ctx, cancel := s.ctx(ctx)
	defer cancel()
	if st.Updated.IsZero() {
		st.Updated = time.Now().UTC()
	}
	_, err := s.c.Put(ctx, s.key("status", name), mustJSON(st))
	return s.explain(err)
}
