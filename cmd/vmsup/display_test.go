package main

import (
	"bufio"
	"context"
	"errors"
	"fmt"
	"image"
	"image/png"
	"io"
	"net"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/coder/websocket"

	"github.com/vmsup/vmsup/internal/dev/testenv"
)

// pngDir is where TestDisplay leaves its pictures for a developer to
// open (it prints the directory): VMSUP_TEST_PNG_DIR, else a fixed
// directory under the system's temp dir, replaced on each run.
func pngDir(t *testing.T) string {
	dir := os.Getenv("VMSUP_TEST_PNG_DIR")
	if dir == "" {
		dir = filepath.Join(os.TempDir(), "vmsup-display-test")
	}
	if err := os.MkdirAll(dir, 0o755); err != nil {
		t.Fatal(err)
	}
	return dir
}

// TestDisplay boots the test guest with [display] (std VGA, its kernel
// printing on tty0 too) and looks at its screen three ways: vmsup
// screenshot (QMP screendump -> PNG), noVNC in headless Chromium reached
// through vmsup console --web with its one-time token, and a raw VNC
// client on vmsup vnc's port. Each picture must show text (far more inked
// pixels than a blank screen's cursor). A wrong token gets a bare 404, a
// used or expired one nothing (no listener); ss shows no TCP port of
// vmsup's or QEMU's while no one watches.
func TestDisplay(t *testing.T) {
	testenv.SkipUnlessRoot(t)
	root, name := t.TempDir(), "dsp"
	file := write(t, t.TempDir(), "dsp.toml", fmt.Sprintf(`name = %q
memory = "256M"
accel = "tcg"
stop_timeout = "20s"

[display]
video = "std"

[boot]
kernel = %q
initrd = %q
cmdline = "console=tty0 console=ttyS0 no_timer_check"
`, name, env.Guest.Kernel, env.Guest.Initrd))
	if r := vmsup(t, root, "", "up", file); r.code != 0 {
		t.Fatalf("up: %+v", r)
	}
	defer vmsup(t, root, "", "kill", name)
	waitCount(t, cliStatus(t, root, name).ConsoleLog, testenv.ReadyMarker, 1)
	dir := pngDir(t)
	t.Logf("pictures in %s", dir)
	noListeners(t, name, "with no one watching")

	shot := filepath.Join(dir, "screenshot.png")
	if r := vmsup(t, root, "", "screenshot", name, shot); r.code != 0 {
		t.Fatalf("screenshot: %+v", r)
	}
	checkInked(t, shot, 2000)

	t.Run("web", func(t *testing.T) { webConsoleSession(t, root, name, dir) })
	t.Run("web-expired", func(t *testing.T) { webConsoleExpires(t, root, name) })
	t.Run("vnc", func(t *testing.T) { vncSession(t, root, name) })
	t.Run("vnc-public", func(t *testing.T) { vncPublic(t, root, name) })
	noListeners(t, name, "after the sessions")
}

// checkInked decodes a PNG and wants at least min bright pixels.
func checkInked(t *testing.T, path string, min int) image.Image {
	t.Helper()
	img, err := decodePNG(path)
	if err != nil {
		t.Fatalf("%s: %v", path, err)
	}
	n := brightPixels(img)
	t.Logf("%s: %dx%d, %d bright (text) pixels", path, img.Bounds().Dx(), img.Bounds().Dy(), n)
	if n < min {
		t.Errorf("%s shows no text: %d bright pixels, want at least %d", path, n, min)
	}
	return img
}

// brightPixels counts the pixels brighter than noVNC's dark page and its
// controls: the text of a VGA text screen (light grey on black) and of a
// console. A blank screen, black or not drawn, has none.
func brightPixels(img image.Image) int {
	n := 0
	b := img.Bounds()
	for y := b.Min.Y; y < b.Max.Y; y++ {
		for x := b.Min.X; x < b.Max.X; x++ {
			r, g, bl, _ := img.At(x, y).RGBA()
			if (299*r+587*g+114*bl)/1000 > 150<<8 {
				n++
			}
		}
	}
	return n
}

// startConsole runs vmsup with args and returns it with the first line it
// printed.
func startConsole(t *testing.T, root string, args ...string) (*exec.Cmd, string, *strings.Builder) {
	t.Helper()
	cmd := vmsupCmd(context.Background(), root, args...)
	out, err := cmd.StdoutPipe()
	if err != nil {
		t.Fatal(err)
	}
	stderr := &strings.Builder{}
	cmd.Stderr = stderr
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		if cmd.ProcessState == nil {
			cmd.Process.Kill() // ours, by its pid
			cmd.Wait()
		}
	})
	line, err := bufio.NewReader(out).ReadString('\n')
	if err != nil {
		t.Fatalf("vmsup %v printed nothing: %v; stderr: %s", args, err, stderr)
	}
	go io.Copy(io.Discard, out)
	return cmd, strings.TrimSpace(line), stderr
}

// waitExit waits for cmd and returns its exit code.
func waitExit(t *testing.T, cmd *exec.Cmd, d time.Duration) int {
	t.Helper()
	done := make(chan error, 1)
	go func() { done <- cmd.Wait() }()
	select {
	case err := <-done:
		var ee *exec.ExitError
		if errors.As(err, &ee) {
			return ee.ExitCode()
		}
		if err != nil {
			t.Fatal(err)
		}
		return 0
	case <-time.After(d):
		t.Fatalf("vmsup %v still runs after %s", cmd.Args[1:], d)
	}
	return -1
}

func webConsoleSession(t *testing.T, root, name, dir string) {
	chromium, err := exec.LookPath("chromium")
	if err != nil {
		t.Skip("chromium is not installed (apt-get install chromium)")
	}
	page := filepath.Join(dir, "novnc.png")
	os.Remove(page)
	cmd, url, stderr := startConsole(t, root, "console", "--web", name)
	addr, token := urlParts(t, url)
	listening(t, addr, true)
	wrongToken(t, addr, token)
	chromiumShot(t, chromium, url, page)
	if code := waitExit(t, cmd, 30*time.Second); code != 0 {
		t.Errorf("console --web exited %d after the browser left: %s", code, stderr)
	}
	checkInked(t, page, 2000)
	listening(t, addr, false)
	if _, err := http.Get(url); err == nil {
		t.Errorf("the used token's URL still answers")
	}
}

// wrongToken: a bare 404 for the page and for the websocket.
func wrongToken(t *testing.T, addr, token string) {
	bad := "http://" + addr + "/" + strings.Repeat("A", len(token))
	if code, body := get(t, bad+"/vnc.html"); code != http.StatusNotFound || strings.Contains(body, "noVNC") {
		t.Errorf("GET with a wrong token: %d %q, want a bare 404", code, body)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	if c, resp, err := websocket.Dial(ctx, "ws"+strings.TrimPrefix(bad, "http")+"/websockify", nil); err == nil {
		c.CloseNow()
		t.Errorf("websocket with a wrong token connected")
	} else if resp == nil || resp.StatusCode != http.StatusNotFound {
		t.Errorf("websocket with a wrong token: %v, want 404", err)
	}
}

func decodePNG(path string) (image.Image, error) {
	f, err := os.Open(path)
	if err != nil {
		return nil, err
	}
	defer f.Close()
	return png.Decode(f)
}

func webConsoleExpires(t *testing.T, root, name string) {
	cmd, url, stderr := startConsole(t, root, "console", "--web", "--timeout", "2s", name)
	addr, _ := urlParts(t, url)
	if code := waitExit(t, cmd, 30*time.Second); code == 0 || !strings.Contains(stderr.String(), "token has expired") {
		t.Errorf("console --web with no browser: exit %d, stderr %q; want an error saying the token expired", code, stderr)
	}
	listening(t, addr, false)
	if _, err := http.Get(url); err == nil {
		t.Errorf("the expired token's URL still answers")
	}
}

// vncSession: vmsup vnc's port speaks RFB and is gone once the client
// leaves.
func vncSession(t *testing.T, root, name string) {
	cmd, line, stderr := startConsole(t, root, "vnc", name)
	addr := strings.TrimPrefix(line, "vnc://")
	c, err := net.DialTimeout("tcp", addr, 5*time.Second)
	if err != nil {
		t.Fatalf("dial %s: %v", addr, err)
	}
	listening(t, addr, false) // closed as soon as the client came
	c.SetDeadline(time.Now().Add(10 * time.Second))
	hello := make([]byte, 12)
	if _, err := io.ReadFull(c, hello); err != nil || !strings.HasPrefix(string(hello), "RFB 003.") {
		t.Errorf("vnc greeting %q, %v", hello, err)
	}
	c.Close()
	if code := waitExit(t, cmd, 30*time.Second); code != 0 {
		t.Errorf("vnc exited %d after the client left: %s", code, stderr)
	}
	if strings.Contains(stderr.String(), "warning") {
		t.Errorf("vnc on loopback warned: %s", stderr)
	}
}

// vncPublic: a --listen address other hosts can reach is refused (exit 2,
// one line) without --listen-public, by vnc and console --web alike; with
// it, vnc serves and warns on stderr that the port is reachable from the
// network and how the session is protected.
func vncPublic(t *testing.T, root, name string) {
	for _, args := range [][]string{{"vnc", "--listen", "0.0.0.0:0", name}, {"vnc", "--listen", ":5999", name},
		{"console", "--web", "--listen", "0.0.0.0:0", name}} {
		r := vmsup(t, root, "", args...)
		want := "not a loopback address: the console would be reachable from the network; give --listen-public"
		if r.code != 2 || !strings.Contains(r.stderr, want) || strings.Count(strings.TrimSpace(r.stderr), "\n") != 0 || r.stdout != "" {
			t.Errorf("vmsup %v: %+v\nwant exit 2 and one line containing %q", args, r, want)
		}
	}
	cmd, line, stderr := startConsole(t, root, "vnc", "--listen", "0.0.0.0:0", "--listen-public", name)
	addr := strings.TrimPrefix(line, "vnc://") // as the listener has it: Go listens on [::] for 0.0.0.0
	_, port, err := net.SplitHostPort(addr)
	if err != nil {
		t.Fatalf("vnc --listen-public printed %q: %v", line, err)
	}
	c, err := net.DialTimeout("tcp", net.JoinHostPort("127.0.0.1", port), 5*time.Second)
	if err != nil {
		t.Fatalf("dial the public port %s: %v", port, err)
	}
	c.SetDeadline(time.Now().Add(10 * time.Second))
	hello := make([]byte, 12)
	if _, err := io.ReadFull(c, hello); err != nil || !strings.HasPrefix(string(hello), "RFB 003.") {
		t.Errorf("vnc greeting on the public port %q, %v", hello, err)
	}
	c.Close()
	if code := waitExit(t, cmd, 30*time.Second); code != 0 {
		t.Errorf("vnc --listen-public exited %d: %s", code, stderr)
	}
	want := "vmsup vnc: warning: listening on " + addr + ", reachable from the network: the first VNC client to connect gets VM \"" + name + "\"'s screen; the connection is not encrypted"
	if !strings.Contains(stderr.String(), want) {
		t.Errorf("vnc --listen-public stderr %q, want the warning %q", stderr, want)
	}
}

func urlParts(t *testing.T, url string) (addr, token string) {
	t.Helper()
	rest, ok := strings.CutPrefix(url, "http://")
	parts := strings.SplitN(rest, "/", 3)
	if !ok || len(parts) < 3 || !strings.HasPrefix(parts[2], "vnc.html?") {
		t.Fatalf("console --web printed %q, want http://ADDR/TOKEN/vnc.html?...", url)
	}
	return parts[0], parts[1]
}

func get(t *testing.T, url string) (int, string) {
	t.Helper()
	resp, err := http.Get(url)
	if err != nil {
		t.Fatalf("GET %s: %v", url, err)
	}
	defer resp.Body.Close()
	b, _ := io.ReadAll(resp.Body)
	return resp.StatusCode, string(b)
}

// listening checks ss -ltn for addr's port, giving a listener closing
// or opening a moment.
func listening(t *testing.T, addr string, want bool) {
	t.Helper()
	_, port, _ := net.SplitHostPort(addr)
	for deadline := time.Now().Add(3 * time.Second); ; time.Sleep(50 * time.Millisecond) {
		out, err := exec.Command("ss", "-ltnH", "sport = :"+port).CombinedOutput()
		if err != nil {
			t.Fatalf("ss: %v\n%s", err, out)
		}
		got := strings.TrimSpace(string(out)) != ""
		if got == want {
			return
		}
		if time.Now().After(deadline) {
			t.Errorf("ss -ltn sport = :%s: %q; want listening=%v", port, out, want)
			return
		}
	}
}

// noListeners: the VM's QEMU listens on no TCP port (its VNC server is a
// unix socket), and no vmsup process runs for it.
func noListeners(t *testing.T, name, when string) {
	t.Helper()
	out, err := exec.Command("ss", "-ltnpH").CombinedOutput()
	if err != nil {
		t.Fatalf("ss: %v\n%s", err, out)
	}
	pids, _ := filepath.Glob("/proc/[0-9]*/cmdline")
	for _, p := range pids {
		b, _ := os.ReadFile(p)
		args := strings.Split(string(b), "\x00")
		pid := filepath.Base(filepath.Dir(p))
		isQEMU := strings.Contains(string(b), "guest="+name+",")
		isOurs := len(args) > 2 && args[0] == vmsupBin && (args[1] == "vnc" || args[1] == "console") && args[len(args)-2] == name
		if (isQEMU || isOurs) && strings.Contains(string(out), "pid="+pid+",") {
			t.Errorf("%s: pid %s (%s) listens on TCP:\n%s", when, pid, args[0], out)
		}
		if isOurs {
			t.Errorf("%s: vmsup %s still runs (pid %s)", when, args[1], pid)
		}
	}
}

// TestWindowsExampleValidates: examples/windows.toml, its ISOs (stand-ins)
// where its comment says (vmsup's image directory, here the test root's),
// passes vmsup validate on this host (OVMF's Secure Boot build, swtpm, the
// files it names).
func TestWindowsExampleValidates(t *testing.T) {
	testenv.SkipUnlessRoot(t)
	data, err := os.ReadFile("../../examples/windows.toml")
	if err != nil {
		t.Fatal(err)
	}
	root := t.TempDir()
	images := filepath.Join(root, "images")
	if err := os.MkdirAll(images, 0o711); err != nil {
		t.Fatal(err)
	}
	if !strings.Contains(string(data), "/var/lib/vmsup/images/") {
		t.Fatal("examples/windows.toml names no file in vmsup's image directory")
	}
	file := write(t, t.TempDir(), "windows.toml", strings.ReplaceAll(string(data), "/var/lib/vmsup/images/", images+"/"))
	for _, iso := range []string{"Win11_English_x64.iso", "virtio-win.iso"} {
		write(t, images, iso, strings.Repeat("\x00", 2048))
	}
	if r := vmsup(t, root, "", "validate", file); r.code != 0 || !strings.Contains(r.stdout, `ok (vm "win11")`) {
		t.Fatalf("vmsup validate examples/windows.toml: %+v", r)
	}
}
