package eventlog

import (
	"os"
	"path/filepath"
	"strings"
	"testing"
)

func TestQEMUEvents(t *testing.T) {
	p := filepath.Join(t.TempDir(), "events.out")
	log := `{"QMP": {"version": {}, "capabilities": ["oob"]}}
{"return": {}}
{"timestamp": {"seconds": 1796161185, "microseconds": 833152}, "event": "STOP"}
{"timestamp": {"seconds": 1796161186, "microseconds": 438757}, "event": "SHUTDOWN", "data": {"guest": true, "reason": "guest-shutdown"}}
{"timestamp": {"seconds": 1796161187, "microseconds": 1}, "event": "SHUTDOWN", "data": {"guest": true, "reason": "guest-reset"}}
{"timestamp": {"seconds": 1796161187, "micro` // cut off mid-line by a kill
	if err := os.WriteFile(p, []byte(log), 0o600); err != nil {
		t.Fatal(err)
	}
	recs, err := QEMUEvents(p, "web")
	if err != nil || len(recs) != 3 {
		t.Fatalf("QEMUEvents: %d records, %v", len(recs), err)
	}
	e := LastOf(recs, "SHUTDOWN")
	if e == nil || e.Reason() != "guest-reset" || e.Time.Unix() != 1796161187 || e.VM != "web" || e.Source != SourceQEMU {
		t.Fatalf("last SHUTDOWN: %+v", e)
	}
	if e := LastOf(recs, "RESET"); e != nil {
		t.Errorf("no RESET in the log, got %+v", e)
	}
	big := strings.Repeat(`{"timestamp": {"seconds": 1, "microseconds": 0}, "event": "RTC_CHANGE", "data": {"offset": 0}}`+"\n", MaxLog/90)
	if err := os.WriteFile(p, []byte(log[:strings.Index(log, "{\"timestamp\": {\"seconds\": 1796161187")]+big), 0o600); err != nil {
		t.Fatal(err)
	}
	recs, _ = QEMUEvents(p, "web")
	if e := LastOf(recs, "SHUTDOWN"); e != nil {
		t.Errorf("an event before the last %d bytes is not read: %+v", MaxLog, e)
	}
}
