package netsetup

import (
	"context"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"runtime"

	"github.com/containernetworking/plugins/pkg/ns"
	"golang.org/x/sys/unix"
)

// NetnsPaths locate one named network namespace: Host is the path this
// process opens, Unit the path the VM's unit (and the systemd that runs it)
// sees. They are the same except when systemd runs in another mount
// namespace (the test sandbox).
type NetnsPaths struct {
	Host string `json:"host"`
	Unit string `json:"unit"`
}

// Netns makes and removes the network namespaces of VMs with cni NICs.
type Netns interface {
	// Create makes the namespace called name, failing with an error
	// wrapping ErrExists if it is already there.
	Create(ctx context.Context, name string) (NetnsPaths, error)
	// Paths returns where the namespace called name is (or would be).
	Paths(name string) NetnsPaths
	// Delete removes it; a missing one is not an error.
	Delete(ctx context.Context, name string) error
}

// NamedNetns keeps namespaces as bind mounts in Dir, like `ip netns`
// (Dir "/run/netns" makes them visible to `ip netns` too).
type NamedNetns struct{ Dir string }

// Paths implements Netns.
func (n NamedNetns) Paths(name string) NetnsPaths {
	p := filepath.Join(n.Dir, name)
	return NetnsPaths{Host: p, Unit: p}
}

// Create implements Netns: a new namespace made by a throw-away OS thread
// and bind-mounted on Dir/name.
func (n NamedNetns) Create(ctx context.Context, name string) (NetnsPaths, error) {
	p := n.Paths(name)
	if err := ctx.Err(); err != nil {
		return p, err
	}
	if err := os.MkdirAll(n.Dir, 0o755); err != nil {
		return p, fmt.Errorf("netns %s: %w", name, err)
	}
	f, err := os.OpenFile(p.Host, os.O_CREATE|os.O_EXCL|os.O_RDONLY, 0o444)
	if errors.Is(err, os.ErrExist) {
		return p, fmt.Errorf("netns %s: %w", p.Host, ErrExists)
	}
	if err != nil {
		return p, fmt.Errorf("netns %s: %w", name, err)
	}
	f.Close()
	errc := make(chan error, 1)
	go func() {
		// This thread's namespace changes and it is never unlocked, so Go
		// ends the thread with the goroutine instead of reusing it.
		runtime.LockOSThread()
		if err := unix.Unshare(unix.CLONE_NEWNET); err != nil {
			errc <- fmt.Errorf("unshare: %w", err)
			return
		}
		self := fmt.Sprintf("/proc/self/task/%d/ns/net", unix.Gettid())
		if err := unix.Mount(self, p.Host, "none", unix.MS_BIND, ""); err != nil {
			errc <- fmt.Errorf("bind mount: %w", err)
			return
		}
		errc <- nil
	}()
	if err := <-errc; err != nil {
		os.Remove(p.Host)
		return p, fmt.Errorf("netns %s: %w", name, err)
	}
	if err := SetLoopbackUp(p.Host); err != nil {
		n.Delete(ctx, name)
		return p, err
	}
	return p, nil
}

// Delete implements Netns.
func (n NamedNetns) Delete(_ context.Context, name string) error {
	return DeleteNetnsPath(n.Paths(name).Host)
}

// DeleteNetnsPath unmounts and removes a namespace bind mount at path, in
// this process's mount namespace; a missing one is not an error.
func DeleteNetnsPath(path string) error {
	if err := unix.Unmount(path, unix.MNT_DETACH); err != nil && !errors.Is(err, unix.EINVAL) && !errors.Is(err, unix.ENOENT) {
		return fmt.Errorf("netns %s: unmount: %w", path, err)
	}
	if err := os.Remove(path); err != nil && !errors.Is(err, os.ErrNotExist) {
		return fmt.Errorf("netns %s: %w", path, err)
	}
	return nil
}

// InNetns runs fn with the calling goroutine's thread in the namespace at
// path (pkg/ns restores the thread afterwards). Programs fn starts inherit
// the namespace.
func InNetns(path string, fn func() error) error {
	return ns.WithNetNSPath(path, func(ns.NetNS) error { return fn() })
}

// SameNetns reports whether the namespace files a and b are one namespace.
func SameNetns(a, b string) bool {
	var sa, sb unix.Stat_t
	if unix.Stat(a, &sa) != nil || unix.Stat(b, &sb) != nil {
		return false
	}
	return sa.Dev == sb.Dev && sa.Ino == sb.Ino
}
