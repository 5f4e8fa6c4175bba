// Package networktest holds vmsup's network integration tests: real guests
// on Linux bridges, Open vSwitch (userspace datapath) and CNI networks, NIC
// hotplug, crash recovery and leak counting. The whole test binary runs in
// a network namespace of its own (testenv.InPrivateNetns), with the systemd
// sandbox, the OVS daemons and the CNI plugins inside it, so no test ever
// touches the host's interfaces. It has no non-test code.
package networktest
