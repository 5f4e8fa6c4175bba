package netmanage_test

import (
	"bytes"
	"encoding/binary"
	"net"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"golang.org/x/sys/unix"
)

// sniffer records the frames of one interface (AF_PACKET): on a tap, the
// outgoing ones are what its guest receives; on the bridge, the incoming
// ones are what the host receives.
type sniffer struct {
	fd     int
	mu     sync.Mutex
	frames []frame
	stop   atomic.Bool
	done   chan struct{}
}

type frame struct {
	b        []byte
	outgoing bool
}

func sniff(t *testing.T, ifname string) *sniffer {
	t.Helper()
	ifi, err := net.InterfaceByName(ifname)
	if err != nil {
		t.Fatal(err)
	}
	proto := int(htons(unix.ETH_P_ALL))
	fd, err := unix.Socket(unix.AF_PACKET, unix.SOCK_RAW, proto)
	if err != nil {
		t.Fatal(err)
	}
	if err := unix.Bind(fd, &unix.SockaddrLinklayer{Protocol: htons(unix.ETH_P_ALL), Ifindex: ifi.Index}); err != nil {
		unix.Close(fd)
		t.Fatal(err)
	}
	tv := unix.NsecToTimeval(int64(200 * time.Millisecond))
	unix.SetsockoptTimeval(fd, unix.SOL_SOCKET, unix.SO_RCVTIMEO, &tv)
	s := &sniffer{fd: fd, done: make(chan struct{})}
	go func() {
		defer close(s.done)
		buf := make([]byte, 65536)
		for !s.stop.Load() {
			n, from, err := unix.Recvfrom(fd, buf, 0)
			if err == unix.EAGAIN || err == unix.EINTR {
				continue
			}
			if err != nil {
				return
			}
			ll, _ := from.(*unix.SockaddrLinklayer)
			s.mu.Lock()
			s.frames = append(s.frames, frame{b: bytes.Clone(buf[:n]), outgoing: ll != nil && ll.Pkttype == unix.PACKET_OUTGOING})
			s.mu.Unlock()
		}
	}()
	t.Cleanup(s.close)
	return s
}

// close stops the reader before it closes the socket: a reader still
// reading a closed descriptor's number would read the next sniffer's
// socket (the number is reused) and take its frames.
func (s *sniffer) close() {
	s.stop.Store(true)
	<-s.done
	unix.Close(s.fd)
}

// reset forgets what was recorded.
func (s *sniffer) reset() {
	s.mu.Lock()
	s.frames = nil
	s.mu.Unlock()
}

// count counts the recorded frames of one direction that match.
func (s *sniffer) count(outgoing bool, match func(b []byte) bool) int {
	s.mu.Lock()
	defer s.mu.Unlock()
	n := 0
	for _, f := range s.frames {
		if f.outgoing == outgoing && len(f.b) >= 14 && match(f.b) {
			n++
		}
	}
	return n
}

func htons(v uint16) uint16 { return v<<8 | v>>8 }

// Frame fields.
func srcMAC(b []byte) net.HardwareAddr { return b[6:12] }
func etherType(b []byte) uint16        { return binary.BigEndian.Uint16(b[12:14]) }

// ipv4Src is an IPv4 frame's source address (nil for other frames).
func ipv4Src(b []byte) net.IP {
	if etherType(b) != unix.ETH_P_IP || len(b) < 34 {
		return nil
	}
	return b[26:30]
}

// arpSender is an ARP frame's sender address (nil for other frames).
func arpSender(b []byte) net.IP {
	if etherType(b) != unix.ETH_P_ARP || len(b) < 42 {
		return nil
	}
	return b[28:32]
}

// udpSrcPort is a UDP frame's source port (0 for other frames).
func udpSrcPort(b []byte) uint16 {
	if ipv4Src(b) == nil || b[23] != unix.IPPROTO_UDP {
		return 0
	}
	ihl := int(b[14]&0x0f) * 4
	if len(b) < 14+ihl+2 {
		return 0
	}
	return binary.BigEndian.Uint16(b[14+ihl:])
}

// ipv6Src is an IPv6 frame's source address (nil for other frames).
func ipv6Src(b []byte) net.IP {
	if etherType(b) != unix.ETH_P_IPV6 || len(b) < 54 {
		return nil
	}
	return b[22:38]
}

// icmp6Type is an ICMPv6 frame's type (0 for other frames; no extension
// headers: the guests' frames here have none).
func icmp6Type(b []byte) byte {
	if ipv6Src(b) == nil || b[20] != unix.IPPROTO_ICMPV6 || len(b) < 55 {
		return 0
	}
	return b[54]
}

// ndTarget is a neighbour solicit's or advert's target (nil for others).
func ndTarget(b []byte) net.IP {
	if t := icmp6Type(b); (t != 135 && t != 136) || len(b) < 78 {
		return nil
	}
	return b[62:78]
}

// udp6SrcPort is a UDP-over-IPv6 frame's source port (0 for others).
func udp6SrcPort(b []byte) uint16 {
	if ipv6Src(b) == nil || b[20] != unix.IPPROTO_UDP || len(b) < 56 {
		return 0
	}
	return binary.BigEndian.Uint16(b[54:])
}
