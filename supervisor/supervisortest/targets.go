package supervisortest

import (
	"context"
	"fmt"
	"os"
	"path/filepath"
	"sync"
	"testing"
	"time"

	"github.com/vmsup/vmsup/internal/dev/testenv"
)

// Targets are a real iSCSI target (tgtd) and a one-node Ceph cluster on
// loopback that a test package shares: started side by side by the first
// test that needs one, stopped by Stop (from TestMain). Both are installed
// by scripts/install-deps.sh, so one that does not start fails the test.
type Targets struct {
	once    sync.Once
	Dir     string
	TGT     *testenv.TGT
	Ceph    *testenv.Ceph
	Started time.Duration // how long starting both took

	tgtErr, cephErr error
	mu              sync.Mutex
	tid             int
}

func (s *Targets) start() {
	s.once.Do(func() {
		t0 := time.Now()
		var err error
		if s.Dir, err = os.MkdirTemp("", "vmsup-targets-"); err != nil {
			s.tgtErr, s.cephErr = err, err
			return
		}
		ctx, cancel := context.WithTimeout(context.Background(), 3*time.Minute)
		defer cancel()
		var wg sync.WaitGroup
		wg.Add(2)
		go func() {
			defer wg.Done()
			s.TGT, s.tgtErr = testenv.StartTGT(ctx, filepath.Join(s.Dir, "tgt"))
		}()
		go func() {
			defer wg.Done()
			s.Ceph, s.cephErr = testenv.StartCeph(ctx, filepath.Join(s.Dir, "ceph"))
		}()
		wg.Wait()
		s.Started = time.Since(t0)
	})
}

// NeedTGT returns the shared tgtd or fails the test.
func (s *Targets) NeedTGT(t testing.TB) *testenv.TGT {
	t.Helper()
	s.start()
	if s.tgtErr != nil {
		t.Fatalf("iSCSI target: %v", s.tgtErr)
	}
	return s.TGT
}

// NeedCeph returns the shared cluster or fails the test.
func (s *Targets) NeedCeph(t testing.TB) *testenv.Ceph {
	t.Helper()
	s.start()
	if s.cephErr != nil {
		t.Fatalf("Ceph cluster: %v", s.cephErr)
	}
	return s.Ceph
}

// NextTID hands out tgt target ids, unique in the package.
func (s *Targets) NextTID() int {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.tid++
	return s.tid
}

// Stop stops what started, by pid, and removes its directory.
func (s *Targets) Stop() {
	if s.TGT != nil {
		if err := s.TGT.Stop(); err != nil {
			fmt.Println("stop tgt:", err)
		}
	}
	if s.Ceph != nil {
		if err := s.Ceph.Stop(); err != nil {
			fmt.Println("stop ceph:", err)
		}
	}
	if s.Dir != "" {
		os.RemoveAll(s.Dir)
	}
}
