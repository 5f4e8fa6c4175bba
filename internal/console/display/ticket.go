package display

import (
	"context"
	"crypto/rand"
	"fmt"
	"time"
)

// Passworder is what a VNC ticket needs of QMP (*qmp.Conn has it).
type Passworder interface {
	SetVNCPassword(ctx context.Context, password string) error
	ExpireVNCPassword(ctx context.Context, when string) error
}

// ticketAlphabet: letters and digits a user can type from a terminal,
// without look-alikes.
const ticketAlphabet = "abcdefghijkmnpqrstuvwxyzABCDEFGHJKLMNPQRSTUVWXYZ23456789"

// TicketLen is a ticket's length: the VNC protocol's 8-byte password.
const TicketLen = 8

// Ticket gives the VM's VNC server (display.password = true) a fresh
// random password that expires ttl from now (whole seconds, at least
// one): a client has that long to log in with it, then no password works
// until the next ticket. A session already open stays.
func Ticket(ctx context.Context, p Passworder, ttl time.Duration) (string, error) {
	b := make([]byte, TicketLen)
	if _, err := rand.Read(b); err != nil {
		return "", err
	}
	for i := range b {
		b[i] = ticketAlphabet[int(b[i])%len(ticketAlphabet)]
	}
	pw := string(b)
	if err := p.SetVNCPassword(ctx, pw); err != nil {
		return "", fmt.Errorf("set_password: %w", err)
	}
	secs := max(int(ttl.Round(time.Second)/time.Second), 1)
	if err := p.ExpireVNCPassword(ctx, fmt.Sprintf("+%d", secs)); err != nil {
		return "", fmt.Errorf("expire_password: %w", err)
	}
	return pw, nil
}
