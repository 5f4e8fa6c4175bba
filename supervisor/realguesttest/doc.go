// Package realguesttest runs vmsup's day-2 verbs against a real operating
// system: a Debian 12 guest with systemd, udev, cloud-init, qemu-guest-agent
// and openssh-server, built from Debian's packages by
// scripts/build-real-guest.sh and booted from its own kernel and initrd
// under TCG. The guest boots once and its subtests share it, in order: the
// cloud-init seed, the agent's exec and cp, DHCP, DNS and ssh on a managed
// network, disk and NIC hot-plug seen by udev, a disk grown by apply, a
// snapshot the agent's fsfreeze quiesces, backups restored and checked,
// reboots by the agent and by ACPI, migrate --local (an ssh session
// surviving it), vCPU and memory hot-plug, down as a clean systemd
// power-off, and the restored backup booted. The whole test binary runs in a network namespace of its own
// (testenv.InPrivateNetns). It has no non-test code.
//
// Without the image (the script cannot build it here) every test skips
// with the script's reason.
package realguesttest
