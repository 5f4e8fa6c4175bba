// Package peer is the question fleet agents ask each other, on the port
// where they take migrations (mutual TLS with the fleet's certificates),
// when their own lease renewals fail: "does etcd answer you?". An agent
// that reaches no etcd member tells from the answers whether it is cut
// off (some peer reaches etcd, or a peer does not answer: fence) or etcd
// is down for everyone (every peer answers and none reaches it: no
// scheduler can fail anyone over, so its VMs run on).
//
// The question is a TLS connection that offers the ALPN protocol Proto;
// the answer is one JSON line. A connection without it is a migration
// (what `vmsup fleet migrate-connect` sends), so both share the port and
// older clients keep working. The package owns the wire; the agent
// decides what to answer and what the answers mean.
package peer

import (
	"bufio"
	"context"
	"crypto/tls"
	"encoding/json"
	"fmt"
	"io"
	"net"
	"slices"
	"sync"
	"time"
)

// Proto is the ALPN protocol of the question.
const Proto = "vmsup-peer/1"

// Reach is what a host knows of etcd.
type Reach int

// What an answer says of etcd.
const (
	// Unknown: the agent cannot tell yet (not registered): it may
	// reach etcd, so it does not hold a fence off.
	Unknown Reach = iota
	Reachable
	// Leaderless: members answer, none has a leader: no lease can lapse.
	Leaderless
	// Unreachable: no member answers.
	Unreachable
)

var reachNames = [...]string{Unknown: "unknown", Reachable: "reachable", Leaderless: "leaderless", Unreachable: "unreachable"}

func (r Reach) String() string {
	if r < 0 || int(r) >= len(reachNames) {
		return fmt.Sprintf("Reach(%d)", int(r))
	}
	return reachNames[r]
}

// MarshalText writes the name.
func (r Reach) MarshalText() ([]byte, error) { return []byte(r.String()), nil }

// UnmarshalText reads a name; one it does not know is Unknown.
func (r *Reach) UnmarshalText(b []byte) error {
	*r = Unknown
	if i := slices.Index(reachNames[:], string(b)); i >= 0 {
		*r = Reach(i)
	}
	return nil
}

// Answer is a host's answer.
type Answer struct {
	Host string `json:"host"`
	Etcd Reach  `json:"etcd"`
	// HoldUntil: a host that answers that it does not reach etcd
	// promises to fail no host over before this time (the asker's fence
	// point comes before it), whoever it reaches later.
	HoldUntil time.Time `json:"hold_until,omitzero"`
	// Peers are the other hosts the answering agent knows: an asker that
	// did not ask one of them (it joined since the asker's last read of
	// the fleet) cannot know that all are cut.
	Peers []string `json:"peers,omitempty"`
}

// ClientConfig is conf (the fleet's mutual-TLS client set-up) asking the
// question.
func ClientConfig(conf *tls.Config) *tls.Config {
	c := conf.Clone()
	c.NextProtos = []string{Proto}
	return c
}

// ServerConfig is conf (the agent's mutual-TLS server set-up) taking the
// question beside migrations.
func ServerConfig(conf *tls.Config) *tls.Config {
	c := conf.Clone()
	c.NextProtos = []string{Proto}
	return c
}

// IsQuestion reports whether the (handshaken) connection asks the
// question rather than carrying a migration.
func IsQuestion(c *tls.Conn) bool { return c.ConnectionState().NegotiatedProtocol == Proto }

// Respond writes the answer on c.
func Respond(c net.Conn, a Answer) error {
	b, err := json.Marshal(a)
	if err != nil {
		return err
	}
	_, err = c.Write(append(b, '\n'))
	return err
}

// Ask asks the agent at addr, within ctx; conf is ClientConfig's.
func Ask(ctx context.Context, conf *tls.Config, addr string) (Answer, error) {
	d := tls.Dialer{Config: conf}
	c, err := d.DialContext(ctx, "tcp", addr)
	if err != nil {
		return Answer{}, fmt.Errorf("peer %s: %w", addr, err)
	}
	defer c.Close()
	if p := c.(*tls.Conn).ConnectionState().NegotiatedProtocol; p != Proto {
		return Answer{}, fmt.Errorf("peer %s: does not take the question (protocol %q)", addr, p)
	}
	if dl, ok := ctx.Deadline(); ok {
		c.SetReadDeadline(dl)
	}
	// One short line: a peer cannot make the asker read more.
	line, err := bufio.NewReader(io.LimitReader(c, 4096)).ReadBytes('\n')
	if err != nil {
		return Answer{}, fmt.Errorf("peer %s: %w", addr, err)
	}
	var a Answer
	if err := json.Unmarshal(line, &a); err != nil {
		return Answer{}, fmt.Errorf("peer %s: %w", addr, err)
	}
	return a, nil
}

// AskAll asks every host of peers (name -> address) at once, all within d;
// a host whose answer did not come has an error instead.
func AskAll(ctx context.Context, conf *tls.Config, peers map[string]string, d time.Duration) (map[string]Answer, map[string]error) {
	ctx, cancel := context.WithTimeout(ctx, d)
	defer cancel()
	answers, errs := map[string]Answer{}, map[string]error{}
	var mu sync.Mutex
	var wg sync.WaitGroup
	for name, addr := range peers {
		wg.Go(func() {
			a, err := Ask(ctx, conf, addr)
			mu.Lock()
			defer mu.Unlock()
			if err != nil {
				errs[name] = err
				return
			}
			answers[name] = a
		})
	}
	wg.Wait()
	return answers, errs
}
