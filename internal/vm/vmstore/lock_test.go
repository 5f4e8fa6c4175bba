package vmstore

import (
	"context"
	"os"
	"path/filepath"
	"testing"
	"time"
)

// TestLockFilesGo: the lock file of a name with no VM (a failed first up,
// an rm) goes when its lock is let go; a VM's stays; a waiter that was
// blocked on a removed file locks the one now at the path.
func TestLockFilesGo(t *testing.T) {
	ctx := context.Background()
	s := Store{Root: t.TempDir()}
	lockPath := func(n string) string { return filepath.Join(s.Root, "vms", "."+n+".lock") }

	lk, err := s.Lock(ctx, "gone", "test", false)
	if err != nil {
		t.Fatal(err)
	}
	lk.Unlock()
	if _, err := os.Stat(lockPath("gone")); !os.IsNotExist(err) {
		t.Fatalf("lock file of a name without a VM left: %v", err)
	}

	if err := os.MkdirAll(s.Paths("kept").Dir, 0o700); err != nil {
		t.Fatal(err)
	}
	lk, _ = s.Lock(ctx, "kept", "test", false)
	lk.Unlock()
	if _, err := os.Stat(lockPath("kept")); err != nil {
		t.Fatalf("a VM's lock file went: %v", err)
	}

	// A holds "gone" again; B waits; A lets go (removing the file): B must
	// hold a lock on the file at the path, and C must then be refused.
	a, _ := s.Lock(ctx, "gone", "a", false)
	got := make(chan *FileLock)
	go func() {
		b, err := s.Lock(ctx, "gone", "b", true)
		if err != nil {
			t.Error(err)
		}
		got <- b
	}()
	time.Sleep(100 * time.Millisecond)
	a.Unlock()
	b := <-got
	if !b.current() {
		t.Fatal("the waiter locked a file that is no longer at the path")
	}
	if c, err := s.TryLock(ctx, "gone", "c"); c != nil || err != nil {
		t.Fatalf("a third locker got the lock the waiter holds: %v %v", c, err)
	}
	b.Unlock()
}
