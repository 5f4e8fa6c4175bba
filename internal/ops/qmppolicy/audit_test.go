package qmppolicy

import (
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"fmt"
	"strings"
	"testing"
)

// TestAuditEntryBounded: whatever a raw command holds (a 120 KB id before
// "execute", a long key, a long list, deep nesting, not JSON at all), its
// audit entry stays small and still names the command and the whole's
// size and hash.
func TestAuditEntryBounded(t *testing.T) {
	pad := strings.Repeat("x", 120<<10)
	for _, c := range []struct{ name, cmd, execute string }{
		{"id first", `{"id":"` + pad + `","execute":"migrate","arguments":{"uri":"exec:cat"}}`, "migrate"},
		{"long key", `{"execute":"blockdev-add","arguments":{"` + pad + `":1,"` + pad + `y":2}}`, "blockdev-add"},
		{"long list", `{"execute":"transaction","arguments":{"actions":[` + strings.Repeat(`{"type":"abort"},`, 10000) + `{"type":"abort"}]}}`, "transaction"},
		{"deep", `{"execute":"blockdev-add","arguments":` + strings.Repeat(`{"file":`, 30) + `"x"` + strings.Repeat(`}`, 30) + `}`, "blockdev-add"},
		{"wide", `{"execute":"object-add","arguments":{` + manyKeys(5000) + `}}`, "object-add"},
		{"not JSON", "nope " + pad, ""},
	} {
		r := &Refusal{Command: c.execute, Class: NotListed, Reason: "test"}
		e := NewAuditEntry(Refused, r, []byte(c.cmd))
		line, err := json.Marshal(e)
		if err != nil {
			t.Fatal(err)
		}
		sum := sha256.Sum256([]byte(c.cmd))
		if len(line) > maxAuditCommand+2048 || e.Execute != c.execute || e.Size != len(c.cmd) || e.SHA256 != hex.EncodeToString(sum[:]) || !e.Shortened {
			t.Errorf("%s: entry of %d bytes, execute %q, size %d, shortened %v", c.name, len(line), e.Execute, e.Size, e.Shortened)
		}
	}
	small := `{"execute":"query-status","id":1}`
	if e := NewAuditEntry(Passed, nil, []byte(small)); string(e.Command) != small || e.Shortened {
		t.Errorf("a small command is logged as %s (shortened %v)", e.Command, e.Shortened)
	}
}

func manyKeys(n int) string {
	var b strings.Builder
	for i := range n {
		fmt.Fprintf(&b, `"k%d":%d,`, i, i)
	}
	return strings.TrimSuffix(b.String(), ",")
}
