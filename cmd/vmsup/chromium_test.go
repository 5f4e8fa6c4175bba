package main

import (
	"bufio"
	"bytes"
	"context"
	"encoding/base64"
	"encoding/json"
	"fmt"
	"image/png"
	"os"
	"os/exec"
	"regexp"
	"testing"
	"time"

	"github.com/coder/websocket"
)

// cdp is a Chrome DevTools Protocol connection to a headless Chromium.
type cdp struct {
	c    *websocket.Conn
	next int
}

// call sends method (to session when set) and returns its result,
// skipping the events in between.
func (p *cdp) call(ctx context.Context, session, method string, params any, result any) error {
	p.next++
	msg := map[string]any{"id": p.next, "method": method, "params": params}
	if session != "" {
		msg["sessionId"] = session
	}
	b, _ := json.Marshal(msg)
	if err := p.c.Write(ctx, websocket.MessageText, b); err != nil {
		return err
	}
	for {
		_, data, err := p.c.Read(ctx)
		if err != nil {
			return err
		}
		var r struct {
			ID     int
			Result json.RawMessage
			Error  *struct{ Message string }
		}
		if json.Unmarshal(data, &r) != nil || r.ID != p.next {
			continue
		}
		if r.Error != nil {
			return fmt.Errorf("%s: %s", method, r.Error.Message)
		}
		return json.Unmarshal(r.Result, result)
	}
}

var devtoolsRE = regexp.MustCompile(`DevTools listening on (ws://\S+)`)

// chromiumShot opens url in headless Chromium and saves a picture of it
// to page once it shows text (or after 30 s, the last one), then closes
// the tab, as a user leaving the page does. Chromium's own --screenshot
// takes its picture when its virtual time runs out, which frames arriving
// on a websocket do not hold up: over DevTools the test waits in real time.
func chromiumShot(t *testing.T, chromium, url, page string) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 90*time.Second)
	defer cancel()
	cmd := exec.CommandContext(ctx, chromium, "--headless", "--no-sandbox", "--disable-gpu", "--hide-scrollbars",
		"--window-size=1024,768", "--remote-debugging-address=127.0.0.1", "--remote-debugging-port=0",
		"--user-data-dir="+t.TempDir(), "about:blank")
	stderr, err := cmd.StderrPipe()
	if err != nil {
		t.Fatal(err)
	}
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	defer func() { cmd.Process.Kill(); cmd.Wait() }() // ours, by its pid
	ws := ""
	sc := bufio.NewScanner(stderr)
	for ws == "" && sc.Scan() {
		if m := devtoolsRE.FindStringSubmatch(sc.Text()); m != nil {
			ws = m[1]
		}
	}
	if ws == "" {
		t.Fatalf("chromium printed no DevTools address")
	}
	go func() { // the rest of its messages, so it never blocks on them
		for sc.Scan() {
		}
	}()
	c, _, err := websocket.Dial(ctx, ws, nil)
	if err != nil {
		t.Fatalf("DevTools: %v", err)
	}
	defer c.CloseNow()
	c.SetReadLimit(64 << 20) // screenshots
	p := &cdp{c: c}
	var target struct{ TargetID string }
	if err := p.call(ctx, "", "Target.createTarget", map[string]any{"url": url}, &target); err != nil {
		t.Fatal(err)
	}
	var att struct{ SessionID string }
	if err := p.call(ctx, "", "Target.attachToTarget", map[string]any{"targetId": target.TargetID, "flatten": true}, &att); err != nil {
		t.Fatal(err)
	}
	var shot []byte
	for deadline := time.Now().Add(30 * time.Second); time.Now().Before(deadline); time.Sleep(500 * time.Millisecond) {
		var r struct{ Data string }
		if err := p.call(ctx, att.SessionID, "Page.captureScreenshot", map[string]any{"format": "png"}, &r); err != nil {
			t.Fatal(err)
		}
		if shot, err = base64.StdEncoding.DecodeString(r.Data); err != nil {
			t.Fatal(err)
		}
		if img, err := png.Decode(bytes.NewReader(shot)); err == nil && brightPixels(img) >= 2000 {
			break
		}
	}
	if err := os.WriteFile(page, shot, 0o644); err != nil {
		t.Fatal(err)
	}
	var closed struct{ Success bool }
	if err := p.call(ctx, "", "Target.closeTarget", map[string]any{"targetId": target.TargetID}, &closed); err != nil {
		t.Errorf("close the tab: %v", err)
	}
}
