package vncproxy

import (
	"errors"
	"fmt"
	"net"
	"strings"
)

// ErrPublic is wrapped by CheckListen's refusal of an address other hosts
// can reach given without the caller's consent.
var ErrPublic = errors.New("not a loopback address")

// CheckListen refuses an address to listen on that is not loopback
// (127.0.0.0/8, ::1, localhost) unless public: a console's port hands the
// VM's screen to whoever connects first, so reaching it from the network
// must be asked for by name, not come from a typo. An empty host (":5900")
// listens on every interface, so it is public too.
func CheckListen(addr string, public bool) error {
	host, _, err := net.SplitHostPort(addr)
	if err != nil {
		return fmt.Errorf("--listen %s: %w", addr, err)
	}
	if public || Loopback(host) {
		return nil
	}
	return fmt.Errorf("--listen %s: %w: the console would be reachable from the network; give --listen-public to mean it", addr, ErrPublic)
}

// Loopback reports whether host (an IP address or a name) is this
// machine's loopback. Names other than localhost are not resolved: what
// they resolve to can change after the check.
func Loopback(host string) bool {
	if strings.EqualFold(host, "localhost") {
		return true
	}
	ip := net.ParseIP(strings.Trim(host, "[]"))
	return ip != nil && ip.IsLoopback()
}
