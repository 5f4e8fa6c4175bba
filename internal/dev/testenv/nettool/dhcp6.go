package main

import (
	"bytes"
	"crypto/rand"
	"encoding/binary"
	"errors"
	"fmt"
	"net"
	"os/exec"
	"time"
)

// DHCPv6 message types and options (RFC 8415).
const (
	dhcp6MsgSolicit   = 1
	dhcp6MsgAdvertise = 2
	dhcp6MsgRequest   = 3
	dhcp6MsgReply     = 7
	optClientID       = 1
	optServerID       = 2
	optIANA           = 3
	optIAAddr         = 5
	optElapsed        = 8
	optStatus         = 13
	optRapidCommit    = 14
)

// duid is the DUID-LL of mac.
func duid(mac net.HardwareAddr) []byte { return append([]byte{0, 3, 0, 1}, mac...) }

func option(b []byte, code uint16, data []byte) []byte {
	b = binary.BigEndian.AppendUint16(b, code)
	b = binary.BigEndian.AppendUint16(b, uint16(len(data)))
	return append(b, data...)
}

// options splits a DHCPv6 option list.
func options(b []byte) map[uint16][]byte {
	out := map[uint16][]byte{}
	for len(b) >= 4 {
		code, n := binary.BigEndian.Uint16(b), int(binary.BigEndian.Uint16(b[2:]))
		if len(b) < 4+n {
			break
		}
		if _, dup := out[code]; !dup {
			out[code] = b[4 : 4+n]
		}
		b = b[4+n:]
	}
	return out
}

// dhcp6 leases an address for ifi (Solicit with rapid commit, or
// Solicit, Advertise, Request, Reply), adds it as a /128 and prints it.
func dhcp6(ifi *net.Interface) error {
	// The link-local address is tentative for a while after the link
	// comes up: it cannot be bound until DAD has passed.
	var c *net.UDPConn
	var err error
	for deadline := time.Now().Add(20 * time.Second); ; time.Sleep(100 * time.Millisecond) {
		c, err = net.ListenUDP("udp6", &net.UDPAddr{IP: linkLocal(ifi.HardwareAddr), Port: 546, Zone: ifi.Name})
		if err == nil {
			break
		}
		if time.Now().After(deadline) {
			return err
		}
	}
	defer c.Close()
	servers := &net.UDPAddr{IP: net.ParseIP("ff02::1:2"), Port: 547, Zone: ifi.Name}
	ia := []byte{0, 0, 0, 1, 0, 0, 0, 0, 0, 0, 0, 0}
	var addr net.IP
	for try := 0; try < 10 && addr == nil; try++ {
		msg, opts, err := exchange(c, servers, dhcp6MsgSolicit, ifi.HardwareAddr, ia, nil)
		if err != nil {
			continue
		}
		if msg == dhcp6MsgAdvertise {
			if msg, opts, err = exchange(c, servers, dhcp6MsgRequest, ifi.HardwareAddr, opts[optIANA], opts[optServerID]); err != nil {
				continue
			}
		}
		if msg == dhcp6MsgReply {
			addr = leased(opts)
		}
	}
	if addr == nil {
		return errors.New("dhcp6: no address leased")
	}
	if !has(ifi, addr) { // with SLAAC as well ("both"), the kernel may have it already
		if out, err := exec.Command("ip", "-6", "addr", "add", addr.String()+"/128", "dev", ifi.Name).CombinedOutput(); err != nil {
			return fmt.Errorf("ip -6 addr add %s: %v: %s", addr, err, out)
		}
	}
	fmt.Println(addr)
	return nil
}

// exchange sends one message and returns the first answer of its
// transaction (within 2 s): its type and options.
func exchange(c *net.UDPConn, to *net.UDPAddr, msg byte, mac net.HardwareAddr, ia, server []byte) (byte, map[uint16][]byte, error) {
	xid := make([]byte, 3)
	rand.Read(xid)
	b := append([]byte{msg}, xid...)
	b = option(b, optClientID, duid(mac))
	b = option(b, optElapsed, []byte{0, 0})
	b = option(b, optIANA, ia)
	if server != nil {
		b = option(b, optServerID, server)
	} else {
		b = option(b, optRapidCommit, nil)
	}
	if _, err := c.WriteToUDP(b, to); err != nil {
		return 0, nil, err
	}
	buf := make([]byte, 1500)
	c.SetReadDeadline(time.Now().Add(2 * time.Second))
	for {
		n, _, err := c.ReadFromUDP(buf)
		if err != nil {
			return 0, nil, err
		}
		if n >= 4 && bytes.Equal(buf[1:4], xid) {
			return buf[0], options(buf[4:n]), nil
		}
	}
}

// leased is the address in a Reply's IA_NA, nil if none.
func leased(opts map[uint16][]byte) net.IP {
	ia := opts[optIANA]
	if len(ia) < 12 {
		return nil
	}
	inner := options(ia[12:])
	if st := inner[optStatus]; len(st) >= 2 && binary.BigEndian.Uint16(st) != 0 {
		return nil
	}
	if a := inner[optIAAddr]; len(a) >= 24 {
		return net.IP(a[:16])
	}
	return nil
}

// has reports whether ifi has the address ip.
func has(ifi *net.Interface, ip net.IP) bool {
	addrs, _ := ifi.Addrs()
	for _, a := range addrs {
		if n, ok := a.(*net.IPNet); ok && n.IP.Equal(ip) {
			return true
		}
	}
	return false
}
