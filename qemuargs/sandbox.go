package qemuargs

// SeccompSandbox is the value of -sandbox vmsup uses: QEMU's own seccomp
// filter with every optional group denied (obsolete system calls, setuid and
// friends, fork/exec, scheduler and affinity changes). The systemd unit adds
// its own filter on top.
const SeccompSandbox = "on,obsolete=deny,elevateprivileges=deny,spawn=deny,resourcecontrol=deny"

// sandbox is -sandbox.
type sandbox struct{}

func (sandbox) Args() ([]string, error) { return []string{"-sandbox", SeccompSandbox}, nil }
