// Package netmanage owns vmsup's managed networks: host-level definitions
// (vmsup network create/ls/rm, one TOML file each, kept under the state
// root in networks/NAME/), each a Linux bridge with an IPv4 subnet and an
// IPv6 /64 (by default a ULA made from the name) whose host addresses are
// the guests' gateways, NAT to the uplink with an nftables masquerade
// (NAT66 for IPv6, or routed), and a dnsmasq per network, run as a
// sandboxed transient systemd unit (vmsup-dnsmasq@NAME.service), that
// gives every NIC on the network its address by DHCP, router adverts
// (SLAAC) and DHCPv6 as the network's mode says, and resolves the VMs'
// names (A and AAAA).
//
// vmsup decides every address itself: a NIC's nic.ip, or one picked from
// the upper half of the subnet (stable for the VM and NIC) and kept while
// the NIC exists. dnsmasq serves only these static leases ("static" range,
// one dhcp-hostsdir file per tap) and the names (one hostsdir file per
// tap), both re-read by inotify; so anti-spoofing (internal/net/nicfilter)
// knows the one address a guest may use without snooping its DHCP. A
// NIC's IPv6 address is SLAAC's for its MAC, and its DHCPv6 lease the
// same, so that too is known without snooping.
//
// A NIC on a managed network is an attachment (networks/NAME/nics/TAP.json)
// written before anything is made for it and removed last, so that Release
// works from it alone after a crash, from the unit's stop-post hook
// (through internal/net/nics) or the next start's recovery. rm is refused
// while any attachment exists, naming the VM.
//
// It does not own taps (netsetup, internal/net/nics makes them) nor the
// order of a VM's start.
package netmanage
