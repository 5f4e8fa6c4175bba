package vmstore

import (
	"errors"
	"os"
	"testing"
)

// TestOpJournal: an operation's intent and steps are on disk as soon as
// they are recorded (a reader in another process sees them), a second one
// cannot begin over it, and End removes it with its reserve.
func TestOpJournal(t *testing.T) {
	s := Store{Root: t.TempDir()}
	op, err := s.BeginOp("vm", "disk-attach", map[string]string{"disk": "d1"})
	if err != nil {
		t.Fatal(err)
	}
	if _, err := s.BeginOp("vm", "set", nil); !errors.Is(err, ErrOpPending) {
		t.Fatalf("second operation: %v", err)
	}
	if err := op.Step("prepare"); err != nil {
		t.Fatal(err)
	}
	if err := op.SetIntent(map[string]string{"disk": "d1", "bus": "rp2"}); err != nil {
		t.Fatal(err)
	}
	p, err := s.PendingOp("vm")
	if err != nil || p == nil || p.Kind != "disk-attach" || !p.Has("prepare") || string(p.Intent) != `{"bus":"rp2","disk":"d1"}` {
		t.Fatalf("pending: %+v %v", p, err)
	}
	if fi, err := os.Stat(s.Paths("vm").reserveFile()); err != nil || fi.Size() != reserveSize {
		t.Fatalf("reserve: %v %v", fi, err)
	}
	if err := op.End(); err != nil {
		t.Fatal(err)
	}
	if p, err := s.PendingOp("vm"); p != nil || err != nil {
		t.Fatalf("after End: %+v %v", p, err)
	}
	if _, err := os.Stat(s.Paths("vm").reserveFile()); !os.IsNotExist(err) {
		t.Fatalf("reserve left: %v", err)
	}
	// A journal made but never written (zeros where the record should be:
	// its command killed inside BeginOp) is unwritten, not an error:
	// nothing of it happened.
	if err := os.WriteFile(s.Paths("vm").opFile(), make([]byte, 64), 0o600); err != nil {
		t.Fatal(err)
	}
	if p, err := s.PendingOp("vm"); err != nil || p == nil || p.Kind != KindUnwritten {
		t.Fatalf("unwritten journal: %+v %v", p, err)
	} else {
		p.Close()
	}
	// Bytes that are no record are unreadable: what happened is unknown.
	if err := os.WriteFile(s.Paths("vm").opFile(), []byte("{\"kind\": \"snap"), 0o600); err != nil {
		t.Fatal(err)
	}
	if p, err := s.PendingOp("vm"); err != nil || p == nil || p.Kind != "unreadable" {
		t.Fatalf("unreadable journal: %+v %v", p, err)
	} else {
		p.Close()
	}
}

// TestPendingOpWrites: the recovery of an operation journals through the
// operation it loaded (a revert's recovery records its steps so): a second
// reader sees its steps, and End removes it.
func TestPendingOpWrites(t *testing.T) {
	s := Store{Root: t.TempDir()}
	op, err := s.BeginOp("vm", "snapshot-revert", map[string]string{"tag": "s1"})
	if err != nil {
		t.Fatal(err)
	}
	if err := op.Step("stopped"); err != nil {
		t.Fatal(err)
	}
	op.Close() // its command died here
	p, err := s.PendingOp("vm")
	if err != nil || p == nil {
		t.Fatalf("pending: %+v %v", p, err)
	}
	if err := p.Step("overlays"); err != nil {
		t.Fatalf("a step journaled by recovery: %v", err)
	}
	if err := p.SetIntent(map[string]string{"tag": "s1", "dropped": "x"}); err != nil {
		t.Fatalf("an intent journaled by recovery: %v", err)
	}
	q, err := s.PendingOp("vm")
	if err != nil || !q.Has("stopped") || !q.Has("overlays") || string(q.Intent) != `{"dropped":"x","tag":"s1"}` {
		t.Fatalf("what recovery journaled: %+v %v", q, err)
	}
	q.Close()
	if err := p.End(); err != nil {
		t.Fatal(err)
	}
	if q, _ := s.PendingOp("vm"); q != nil {
		t.Fatal("ended, still pending")
	}
}
