package qmp

import (
	"context"
	"fmt"

	"github.com/digitalocean/go-qemu/qmp"
)

type subscriber struct {
	ch      chan qmp.Event
	dropped uint64 // guarded by Conn.smu
}

// Subscribe returns a channel that receives every event QEMU sends from now
// on, and a function that unsubscribes and closes the channel. The channel is
// also closed when ctx is done or the connection ends.
//
// The channel is buffered (WithEventBuffer). A subscriber that falls behind
// never slows the connection: when its buffer is full, its oldest queued event
// is dropped to make room, and DroppedEvents counts it. Subscribe before
// issuing the command whose events you need. Subscribers share each event's
// Data map: treat it as read-only.
func (c *Conn) Subscribe(ctx context.Context) (<-chan qmp.Event, func()) {
	s := &subscriber{ch: make(chan qmp.Event, c.opts.eventBuffer)}
	c.smu.Lock()
	if c.subs == nil {
		c.smu.Unlock()
		close(s.ch)
		return s.ch, func() {}
	}
	c.subs[s] = struct{}{}
	c.smu.Unlock()
	stop := context.AfterFunc(ctx, func() { c.unsubscribe(s) })
	return s.ch, func() {
		stop()
		c.unsubscribe(s)
	}
}

func (c *Conn) unsubscribe(s *subscriber) {
	c.smu.Lock()
	defer c.smu.Unlock()
	if _, ok := c.subs[s]; ok {
		delete(c.subs, s)
		close(s.ch)
	}
}

// Events implements qmp.Monitor: a subscription that ends when ctx is done.
func (c *Conn) Events(ctx context.Context) (<-chan qmp.Event, error) {
	if err := c.Err(); err != nil {
		return nil, err
	}
	ch, _ := c.Subscribe(ctx)
	return ch, nil
}

// DroppedEvents returns how many events were dropped, over all subscribers,
// because a subscriber's buffer was full.
func (c *Conn) DroppedEvents() uint64 { return c.dropped.Load() }

// deliver hands ev to every subscriber without blocking. Sends happen under
// smu, so a channel is never closed while being sent to.
func (c *Conn) deliver(ev qmp.Event) {
	c.smu.Lock()
	defer c.smu.Unlock()
	for s := range c.subs {
		select {
		case s.ch <- ev:
			continue
		default:
		}
		// Full: drop the oldest queued event, then queue ev. The subscriber
		// may drain concurrently, so both steps are non-blocking.
		lost := false
		select {
		case <-s.ch:
			lost = true
		default:
		}
		select {
		case s.ch <- ev:
		default:
			lost = true // unreachable with one sender; never block regardless
		}
		if !lost {
			continue
		}
		s.dropped++
		c.dropped.Add(1)
		if s.dropped == 1 || s.dropped%1000 == 0 {
			c.log.Warn("qmp: slow event subscriber, dropping oldest events", "dropped", s.dropped, "event", ev.Event)
		}
	}
}

// WaitEvent receives from sub until an event named name arrives for which
// match (nil: any) returns true, and returns it. Other events are discarded.
// It waits until ctx is done, so give ctx a deadline; a closed sub returns an
// error wrapping ErrClosed.
func WaitEvent(ctx context.Context, sub <-chan qmp.Event, name string, match func(qmp.Event) bool) (qmp.Event, error) {
	for {
		select {
		case ev, ok := <-sub:
			if !ok {
				return qmp.Event{}, fmt.Errorf("qmp: waiting for event %s: %w", name, ErrClosed)
			}
			if ev.Event == name && (match == nil || match(ev)) {
				return ev, nil
			}
		case <-ctx.Done():
			return qmp.Event{}, fmt.Errorf("qmp: waiting for event %s: %w", name, ctx.Err())
		}
	}
}
