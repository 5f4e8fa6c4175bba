package vsock

import (
	"context"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"strconv"
	"sync"
	"testing"
)

// Many starts at once, each with its own Allocator as separate processes
// would have: no two VMs ever get the same CID, and they fill 3, 4, ...
func TestAcquireConcurrent(t *testing.T) {
	dir := t.TempDir()
	const n = 40
	cids := make([]uint32, n)
	errs := make([]error, n)
	var wg sync.WaitGroup
	for i := range n {
		wg.Add(1)
		go func() {
			defer wg.Done()
			a := Allocator{Dir: dir} // not shared: its own lock fd
			cids[i], errs[i] = a.Acquire(context.Background(), fmt.Sprintf("vm%d", i), 0)
		}()
	}
	wg.Wait()
	checkDistinct(t, dir, n)
	for i, err := range errs {
		if err != nil {
			t.Fatalf("vm%d: %v", i, err)
		}
		if cids[i] < 3 || cids[i] >= 3+n {
			t.Errorf("vm%d got CID %d, want one of 3..%d", i, cids[i], 2+n)
		}
	}
}

// checkDistinct reads the table: n VMs, n different CIDs.
func checkDistinct(t *testing.T, dir string, n int) {
	t.Helper()
	tab, err := Allocator{Dir: dir}.read()
	if err != nil {
		t.Fatal(err)
	}
	if len(tab.CIDs) != n {
		t.Fatalf("%d VMs in the table, want %d", len(tab.CIDs), n)
	}
	owner := map[uint32]string{}
	for vm, c := range tab.CIDs {
		if o, dup := owner[c]; dup {
			t.Fatalf("CID %d given to both %s and %s", c, o, vm)
		}
		owner[c] = vm
	}
}

// The same, with real processes: this test binary run again as children
// that each allocate for several VMs.
func TestAcquireProcesses(t *testing.T) {
	if dir := os.Getenv("VSOCK_TEST_CHILD_DIR"); dir != "" {
		for i := range 5 {
			vm := os.Getenv("VSOCK_TEST_CHILD_PREFIX") + strconv.Itoa(i)
			if _, err := (Allocator{Dir: dir}).Acquire(context.Background(), vm, 0); err != nil {
				t.Fatal(err)
			}
		}
		return
	}
	dir := t.TempDir()
	const procs = 6
	var wg sync.WaitGroup
	for p := range procs {
		wg.Add(1)
		go func() {
			defer wg.Done()
			cmd := exec.Command(os.Args[0], "-test.run=^TestAcquireProcesses$")
			cmd.Env = append(os.Environ(), "VSOCK_TEST_CHILD_DIR="+dir, fmt.Sprintf("VSOCK_TEST_CHILD_PREFIX=p%d-", p))
			if out, err := cmd.CombinedOutput(); err != nil {
				t.Errorf("child %d: %v\n%s", p, err, out)
			}
		}()
	}
	wg.Wait()
	checkDistinct(t, dir, procs*5)
}

func TestAcquireStableAndRelease(t *testing.T) {
	ctx := context.Background()
	a := Allocator{Dir: t.TempDir()}
	web, _ := a.Acquire(ctx, "web", 0)
	db, _ := a.Acquire(ctx, "db", 0)
	if web != 3 || db != 4 {
		t.Fatalf("web %d, db %d; want 3, 4", web, db)
	}
	// A restart of web keeps its CID, even with a lower one free.
	if err := a.Release(ctx, "db"); err != nil {
		t.Fatal(err)
	}
	if again, err := a.Acquire(ctx, "web", 0); err != nil || again != web {
		t.Fatalf("restart of web: %d, %v; want %d", again, err, web)
	}
	if c, _ := a.Lookup("web"); c != web {
		t.Fatalf("Lookup(web) = %d", c)
	}
	if c, _ := a.Lookup("db"); c != 0 {
		t.Fatalf("Lookup(db) after Release = %d, want 0", c)
	}
	// db was released: the next VM gets its CID back.
	if c, _ := a.Acquire(ctx, "cache", 0); c != 4 {
		t.Fatalf("cache got %d, want the released 4", c)
	}
	if c, _ := a.Peek("new", 0); c != 5 {
		t.Fatalf("Peek(new) = %d, want 5", c)
	}
	if c, _ := a.Lookup("new"); c != 0 {
		t.Fatalf("Peek recorded a CID")
	}
}

// A fixed CID another VM holds is refused, naming that VM; nothing changes.
func TestAcquireFixedConflict(t *testing.T) {
	ctx := context.Background()
	a := Allocator{Dir: t.TempDir()}
	if c, err := a.Acquire(ctx, "web", 7); err != nil || c != 7 {
		t.Fatalf("web fixed 7: %d, %v", c, err)
	}
	_, err := a.Acquire(ctx, "db", 7)
	var e *InUseError
	if !errors.As(err, &e) || e.VM != "web" || e.CID != 7 {
		t.Fatalf("db fixed 7: %v; want an InUseError naming web", err)
	}
	if want := `CID 7 is already in use by vm "web"`; err.Error() != want {
		t.Errorf("error %q, want %q", err, want)
	}
	if c, _ := a.Lookup("db"); c != 0 {
		t.Fatalf("the refused VM got CID %d recorded", c)
	}
	// An automatic CID skips the fixed one.
	if c, _ := a.Acquire(ctx, "a", 0); c != 3 {
		t.Fatalf("a got %d", c)
	}
	// web moving to another fixed CID frees 7.
	if c, _ := a.Acquire(ctx, "web", 9); c != 9 {
		t.Fatalf("web to 9: %d", c)
	}
	if c, err := a.Acquire(ctx, "db", 7); err != nil || c != 7 {
		t.Fatalf("db fixed 7 after web moved: %d, %v", c, err)
	}
}

// The kernel's view (faked): CIDs held outside this root are skipped, a
// fixed one is refused, a recorded one taken meanwhile is replaced.
func TestAcquireOutside(t *testing.T) {
	ctx := context.Background()
	outside := map[uint32]bool{3: true, 5: true}
	a := Allocator{Dir: t.TempDir(), InUse: func(c uint32) (bool, error) { return outside[c], nil }}
	if c, _ := a.Acquire(ctx, "web", 0); c != 4 {
		t.Fatalf("web got %d, want 4 (3 held outside)", c)
	}
	_, err := a.Acquire(ctx, "db", 5)
	var e *InUseError
	if !errors.As(err, &e) || e.VM != "" {
		t.Fatalf("fixed 5: %v; want an InUseError from outside", err)
	}
	outside[4] = true // another program took web's CID while web was down
	if c, _ := a.Acquire(ctx, "web", 0); c != 6 {
		t.Fatalf("web got %d, want 6", c)
	}
	boom := errors.New("boom")
	a.InUse = func(uint32) (bool, error) { return false, boom }
	if _, err := a.Acquire(ctx, "x", 0); !errors.Is(err, boom) {
		t.Fatalf("probe error: %v", err)
	}
}
