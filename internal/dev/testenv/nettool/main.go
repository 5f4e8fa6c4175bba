// Command vmsup-nettool is the test guest's IPv6 tool (scripts/build-guest.sh
// puts it in the initramfs as /usr/bin/vmsup-nettool): a DHCPv6 client, which
// busybox lacks, and the hostile frames the anti-spoofing tests send from a
// guest, written whole to a raw packet socket so that nothing in the guest's
// kernel corrects them:
//
//	vmsup-nettool dhcp6 IFACE                       lease an address by DHCPv6, add it, print it
//	vmsup-nettool ra IFACE PREFIX/64                a router advert for PREFIX (SLAAC) to all nodes
//	vmsup-nettool na IFACE TARGET                   an unsolicited neighbour advert: TARGET is at our MAC
//	vmsup-nettool dhcp6-reply IFACE                 a DHCPv6 server's Reply (port 547 to 546) to all nodes
//	vmsup-nettool echo IFACE SRC DST DSTMAC         an ICMPv6 echo request from SRC (any address)
//
// The frames go out three times, 100 ms apart, from the interface's own MAC
// and (but echo) its link-local address. It uses the standard library only,
// so its sources are all the guest's build depends on.
package main

import (
	"encoding/binary"
	"errors"
	"fmt"
	"net"
	"os"
	"syscall"
	"time"
)

func main() {
	if err := run(os.Args[1:]); err != nil {
		fmt.Fprintln(os.Stderr, "vmsup-nettool:", err)
		os.Exit(1)
	}
}

func run(args []string) error {
	if len(args) < 2 {
		return errors.New("usage: vmsup-nettool dhcp6|ra|na|dhcp6-reply|echo IFACE [ARGS]")
	}
	ifi, err := net.InterfaceByName(args[1])
	if err != nil {
		return err
	}
	if args[0] == "dhcp6" {
		return dhcp6(ifi)
	}
	ll := linkLocal(ifi.HardwareAddr)
	allNodes, allNodesMAC := net.ParseIP("ff02::1"), net.HardwareAddr{0x33, 0x33, 0, 0, 0, 1}
	var f []byte
	switch {
	case args[0] == "ra" && len(args) == 3:
		_, p, err := net.ParseCIDR(args[2])
		if err != nil {
			return err
		}
		f = frame(ifi.HardwareAddr, allNodesMAC, ll, allNodes, protoICMPv6, routerAdvert(ifi.HardwareAddr, p))
	case args[0] == "na" && len(args) == 3:
		target := net.ParseIP(args[2])
		f = frame(ifi.HardwareAddr, allNodesMAC, ll, allNodes, protoICMPv6, neighbourAdvert(ifi.HardwareAddr, target))
	case args[0] == "dhcp6-reply" && len(args) == 2:
		f = frame(ifi.HardwareAddr, allNodesMAC, ll, allNodes, protoUDP, udp(547, 546, dhcp6Reply(ifi.HardwareAddr)))
	case args[0] == "echo" && len(args) == 5:
		dstMAC, err := net.ParseMAC(args[4])
		if err != nil {
			return err
		}
		echo := []byte{128, 0, 0, 0, 0x12, 0x34, 0, 1, 'v', 'm', 's', 'u', 'p'}
		f = frame(ifi.HardwareAddr, dstMAC, net.ParseIP(args[2]), net.ParseIP(args[3]), protoICMPv6, echo)
	default:
		return fmt.Errorf("bad command %q", args)
	}
	return sendRaw(ifi, f, 3)
}

const (
	protoICMPv6 = 58
	protoUDP    = 17
	ethIPv6     = 0x86dd
)

// linkLocal is the EUI-64 link-local address of mac.
func linkLocal(mac net.HardwareAddr) net.IP {
	ip := net.ParseIP("fe80::")
	copy(ip[8:], eui64(mac))
	return ip
}

func eui64(mac net.HardwareAddr) []byte {
	return []byte{mac[0] ^ 2, mac[1], mac[2], 0xff, 0xfe, mac[3], mac[4], mac[5]}
}

// frame is an Ethernet frame with an IPv6 packet whose payload's checksum
// (ICMPv6 at 2, UDP at 6) is filled in.
func frame(srcMAC, dstMAC net.HardwareAddr, src, dst net.IP, proto byte, payload []byte) []byte {
	sum := 2
	if proto == protoUDP {
		sum = 6
	}
	binary.BigEndian.PutUint16(payload[sum:], 0)
	binary.BigEndian.PutUint16(payload[sum:], checksum(src, dst, proto, payload))
	b := append([]byte{}, dstMAC...)
	b = append(b, srcMAC...)
	b = binary.BigEndian.AppendUint16(b, ethIPv6)
	b = append(b, 0x60, 0, 0, 0)
	b = binary.BigEndian.AppendUint16(b, uint16(len(payload)))
	b = append(b, proto, 255)
	b = append(b, src.To16()...)
	b = append(b, dst.To16()...)
	return append(b, payload...)
}

// checksum is the Internet checksum over the IPv6 pseudo-header and payload.
func checksum(src, dst net.IP, proto byte, payload []byte) uint16 {
	var b []byte
	b = append(b, src.To16()...)
	b = append(b, dst.To16()...)
	b = binary.BigEndian.AppendUint32(b, uint32(len(payload)))
	b = append(b, 0, 0, 0, proto)
	b = append(b, payload...)
	if len(b)%2 == 1 {
		b = append(b, 0)
	}
	var s uint32
	for i := 0; i < len(b); i += 2 {
		s += uint32(binary.BigEndian.Uint16(b[i:]))
	}
	for s>>16 != 0 {
		s = s&0xffff + s>>16
	}
	return ^uint16(s)
}

// routerAdvert is an RA (default router, 30 min) with a SLAAC prefix and
// our MAC as source link-layer address.
func routerAdvert(mac net.HardwareAddr, p *net.IPNet) []byte {
	b := []byte{134, 0, 0, 0, 64, 0, 0x07, 0x08, 0, 0, 0, 0, 0, 0, 0, 0}
	b = append(b, 1, 1)
	b = append(b, mac...)
	ones, _ := p.Mask.Size()
	b = append(b, 3, 4, byte(ones), 0xc0)                         // prefix information: on-link, autonomous
	b = append(b, 0, 0, 0x0e, 0x10, 0, 0, 0x0e, 0x10, 0, 0, 0, 0) // valid, preferred 3600 s
	return append(b, p.IP.To16()...)
}

// neighbourAdvert is an unsolicited, overriding NA saying target is at mac.
func neighbourAdvert(mac net.HardwareAddr, target net.IP) []byte {
	b := []byte{136, 0, 0, 0, 0x20, 0, 0, 0}
	b = append(b, target.To16()...)
	b = append(b, 2, 1)
	return append(b, mac...)
}

// udp is a UDP datagram (its checksum filled in by frame).
func udp(sport, dport uint16, data []byte) []byte {
	b := binary.BigEndian.AppendUint16(nil, sport)
	b = binary.BigEndian.AppendUint16(b, dport)
	b = binary.BigEndian.AppendUint16(b, uint16(8+len(data)))
	b = append(b, 0, 0)
	return append(b, data...)
}

// dhcp6Reply is a server's Reply handing the client of any transaction the
// address 2001:db8::bad: a server ID, and an IA_NA with the address.
func dhcp6Reply(mac net.HardwareAddr) []byte {
	b := []byte{dhcp6MsgReply, 0xab, 0xcd, 0xef}
	b = option(b, 2, duid(mac))
	ia := []byte{0, 0, 0, 1, 0, 0, 0x0e, 0x10, 0, 0, 0x15, 0x18}
	addr := append(net.ParseIP("2001:db8::bad").To16(), 0, 0, 0x0e, 0x10, 0, 0, 0x1c, 0x20)
	ia = option(ia, 5, addr)
	return option(b, 3, ia)
}

// sendRaw writes f to the interface n times, 100 ms apart.
func sendRaw(ifi *net.Interface, f []byte, n int) error {
	fd, err := syscall.Socket(syscall.AF_PACKET, syscall.SOCK_RAW, 0)
	if err != nil {
		return err
	}
	defer syscall.Close(fd)
	to := &syscall.SockaddrLinklayer{Ifindex: ifi.Index, Halen: 6, Protocol: htons(ethIPv6)}
	copy(to.Addr[:], f[:6])
	for i := 0; i < n; i++ {
		if i > 0 {
			time.Sleep(100 * time.Millisecond)
		}
		if err := syscall.Sendto(fd, f, 0, to); err != nil {
			return err
		}
	}
	return nil
}

func htons(v uint16) uint16 { return v<<8 | v>>8 }
