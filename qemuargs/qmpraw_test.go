package qemuargs

import (
	"bufio"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"net"
	"time"
)

// rawQMP is a minimal QMP client for the acceptance test: JSON lines over a
// unix socket, one command at a time, replies matched by id, events skipped.
// It deliberately does not use vmsup's qmp package (tested on its own).
type rawQMP struct {
	conn net.Conn
	r    *bufio.Reader // no line-length limit, unlike bufio.Scanner
	id   int
}

// dialQMP connects to path, retrying until QEMU listens or ctx ends, and
// reads the greeting.
func dialQMP(ctx context.Context, path string, exited <-chan struct{}) (*rawQMP, error) {
	var d net.Dialer
	for {
		conn, err := d.DialContext(ctx, "unix", path)
		if err == nil {
			q := &rawQMP{conn: conn, r: bufio.NewReaderSize(conn, 1<<16)}
			if dl, ok := ctx.Deadline(); ok {
				conn.SetDeadline(dl)
			}
			var greeting struct {
				QMP *json.RawMessage `json:"QMP"`
			}
			if err := q.read(&greeting); err != nil || greeting.QMP == nil {
				conn.Close()
				return nil, fmt.Errorf("QMP greeting: %v", err)
			}
			return q, nil
		}
		select {
		case <-ctx.Done():
			return nil, fmt.Errorf("dial %s: %w (last error: %v)", path, ctx.Err(), err)
		case <-exited:
			return nil, errors.New("QEMU exited before its QMP socket answered")
		case <-time.After(10 * time.Millisecond):
		}
	}
}

func (q *rawQMP) read(v any) error {
	line, err := q.r.ReadBytes('\n')
	if err != nil {
		return err
	}
	return json.Unmarshal(line, v)
}

// run executes cmd with args (nil for none) and decodes the return value
// into out (nil to ignore it).
func (q *rawQMP) run(cmd string, args, out any) error {
	q.id++
	req := struct {
		Execute   string `json:"execute"`
		Arguments any    `json:"arguments,omitempty"`
		ID        int    `json:"id"`
	}{cmd, args, q.id}
	b, err := json.Marshal(req)
	if err != nil {
		return err
	}
	if _, err := q.conn.Write(append(b, '\n')); err != nil {
		return fmt.Errorf("%s: %w", cmd, err)
	}
	for {
		var resp struct {
			ID     *int            `json:"id"`
			Return json.RawMessage `json:"return"`
			Error  *struct {
				Class string `json:"class"`
				Desc  string `json:"desc"`
			} `json:"error"`
		}
		if err := q.read(&resp); err != nil {
			return fmt.Errorf("%s: %w", cmd, err)
		}
		if resp.ID == nil || *resp.ID != q.id {
			continue // an event
		}
		if resp.Error != nil {
			return fmt.Errorf("%s: %s: %s", cmd, resp.Error.Class, resp.Error.Desc)
		}
		if out == nil {
			return nil
		}
		return json.Unmarshal(resp.Return, out)
	}
}

func (q *rawQMP) Close() error { return q.conn.Close() }
