package eventlog

import (
	"os"
	"path/filepath"
	"strings"
	"testing"
)

func TestLast(t *testing.T) {
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
	e, err := Last(p, "SHUTDOWN")
	if err != nil || e == nil || e.Reason() != "guest-reset" || e.Time().Unix() != 1796161187 {
		t.Fatalf("Last: %+v, %v", e, err)
	}
	if e, _ := Last(p, "RESET"); e != nil {
		t.Errorf("no RESET in the log, got %+v", e)
	}
	big := strings.Repeat(`{"timestamp": {"seconds": 1, "microseconds": 0}, "event": "RTC_CHANGE", "data": {"offset": 0}}`+"\n", 5000)
	if err := os.WriteFile(p, []byte(log[:strings.Index(log, "{\"timestamp\": {\"seconds\": 1796161187")]+big), 0o600); err != nil {
		t.Fatal(err)
	}
	if e, _ := Last(p, "SHUTDOWN"); e != nil {
		t.Errorf("an event before the last 256 KiB is not read: %+v", e)
	}
}
