// Package realhosttest installs vmsup from its own Debian package on a real
// Debian 12 host and uses it there: the host, built from Debian's packages
// by scripts/build-real-host.sh (systemd as PID 1, cgroup v2 only, AppArmor
// enforcing, Debian's QEMU), boots as a VM under vmsup with TCG; the test
// drives it through its guest agent. Inside: dpkg -i of the package
// (scripts/build-deb.sh), vmsup host, the demo VM on the tiny test guest
// (nested KVM where the emulated CPU offers SVM, else nested TCG), its
// AppArmor profile in enforce mode (status, aa-status, the kernel's
// log of a denial), systemd-analyze security, dpkg -r under the running VM,
// vmsup enable and a reboot of the host bringing the VM back, and down.
//
// It boots a 3 GiB host for ~6-7 minutes (5m44s and 6m57s at a load of 5-8
// on 2 cores, nested KVM), so it runs as its own step of
// scripts/test.sh (VMSUP_REALHOST_TEST=1) and skips otherwise, or when the
// image cannot be built here, saying why. It has no non-test code.
package realhosttest
