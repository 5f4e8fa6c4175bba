package supervisor_test

import (
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/vmsup/vmsup/internal/lifecycle/operation"
	"github.com/vmsup/vmsup/internal/vm/vmstore"
	"github.com/vmsup/vmsup/supervisor"
)

// TestUnknownKindGivesUp: a running VM whose journal names a kind this
// vmsup has no recoverer for (another version's) is not settled as if
// nothing happened: the next command fails with one line saying so, the
// VM is off, its disk is still there, and the command after that starts it.
func TestUnknownKindGivesUp(t *testing.T) {
	ctx := ctxT(t, 3*time.Minute)
	root := t.TempDir()
	images := filepath.Join(root, "images")
	if err := os.MkdirAll(images, 0o711); err != nil {
		t.Fatal(err)
	}
	sup := newSup(t, root)
	disk := filepath.Join(images, "data.qcow2")
	f := guestFile(t, t.TempDir(), "unknown", fmt.Sprintf("[[disk]]\nname = \"data\"\nfile = %q\nsize = \"16M\"\n", disk))
	if _, err := sup.Up(ctx, f); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { sup.Kill(ctxT(t, time.Minute), "unknown") })
	if _, err := (vmstore.Store{Root: root}).BeginOp("unknown", "from-a-newer-vmsup", map[string]string{"x": "y"}); err != nil {
		t.Fatal(err)
	}
	err := sup.Reset(ctx, "unknown")
	if !errors.Is(err, operation.ErrUnregistered) || strings.Contains(err.Error(), "\n") ||
		!strings.HasPrefix(err.Error(), `vm "unknown": an interrupted from-a-newer-vmsup (pid `) ||
		!strings.Contains(err.Error(), "gave it up: the VM is off") {
		t.Fatalf("the command after the unknown journal: %v", err)
	}
	if st, err := sup.Status(ctx, "unknown"); err != nil || st.State != supervisor.StateShutOff {
		t.Fatalf("status after giving up: %+v %v", st, err)
	}
	if _, err := os.Stat(disk); err != nil {
		t.Fatalf("the disk after giving up: %v", err)
	}
	if _, err := sup.Up(ctx, f); err != nil {
		t.Fatalf("up after giving up: %v", err)
	}
}
