package diskfds

import (
	"context"
	"fmt"
	"os"
	"time"

	"github.com/vmsup/vmsup/qmp"
)

// How Dial waits for the QEMU a unit has just started: its socket often
// (a stat is nearly free), whether the unit ended less often (D-Bus).
const (
	dialTimeout = 30 * time.Second
	dialPoll    = 5 * time.Millisecond
	endedCheck  = 100 * time.Millisecond
)

// Dial connects to the QEMU whose QMP socket is sock once it answers,
// within dialTimeout; ended reports whether its unit is gone already (the
// error then says why, through lastWords).
func Dial(ctx context.Context, sock string, ended func(context.Context) (bool, error), lastWords func() string, opts ...qmp.Option) (*qmp.Conn, error) {
	ctx, cancel := context.WithTimeout(ctx, dialTimeout)
	defer cancel()
	checked := time.Now()
	for {
		if time.Since(checked) >= endedCheck {
			gone, err := ended(ctx)
			if err != nil {
				return nil, err
			}
			if gone {
				return nil, fmt.Errorf("QEMU exited before it took its disks: %s", lastWords())
			}
			checked = time.Now()
		}
		if _, err := os.Stat(sock); err == nil {
			c, err := qmp.Dial(ctx, sock, opts...)
			if err == nil {
				return c, nil
			}
		}
		select {
		case <-ctx.Done():
			return nil, fmt.Errorf("QEMU did not answer on QMP within %s to take its disks: %s", dialTimeout, lastWords())
		case <-time.After(dialPoll):
		}
	}
}
