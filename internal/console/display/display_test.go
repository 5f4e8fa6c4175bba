package display

import (
	"bytes"
	"context"
	"errors"
	"image/color"
	"os"
	"path/filepath"
	"strings"
	"testing"
)

func TestDecodePPM(t *testing.T) {
	img, err := DecodePPM(strings.NewReader("P6\n# QEMU\n2 1\n255\n\xff\x00\x00\x00\x80\xff"))
	if err != nil {
		t.Fatal(err)
	}
	if got := img.RGBAAt(0, 0); got != (color.RGBA{255, 0, 0, 255}) {
		t.Errorf("pixel 0: %v", got)
	}
	if got := img.RGBAAt(1, 0); got != (color.RGBA{0, 128, 255, 255}) {
		t.Errorf("pixel 1: %v", got)
	}
	img, err = DecodePPM(strings.NewReader("P6 1 1 15\n\x0f\x00\x07"))
	if err != nil || img.RGBAAt(0, 0) != (color.RGBA{255, 0, 119, 255}) {
		t.Errorf("maxval 15: %v, %v", err, img)
	}
	for name, bad := range map[string]string{
		"magic":     "P3\n1 1\n255\n1 2 3",
		"huge":      "P6\n100000 1\n255\n",
		"zero":      "P6\n0 1\n255\n",
		"maxval":    "P6\n1 1\n65535\n\x00\x00\x00\x00\x00\x00",
		"truncated": "P6\n2 2\n255\n\x00\x00\x00",
		"letters":   "P6\n1 x\n255\n",
		"empty":     "",
	} {
		if _, err := DecodePPM(strings.NewReader(bad)); !errors.Is(err, ErrNotPPM) {
			t.Errorf("%s: %v, want ErrNotPPM", name, err)
		}
	}
}

// dumper is a stand-in QEMU: it writes what write makes of the path.
type dumper struct {
	write func(path string) error
	path  string
}

func (d *dumper) Screendump(_ context.Context, path, _ string) error {
	d.path = path
	return d.write(path)
}

func TestScreenshot(t *testing.T) {
	dir := t.TempDir()
	d := &dumper{write: func(p string) error { return os.WriteFile(p, []byte("P6\n1 1\n255\n\x01\x02\x03"), 0o600) }}
	img, err := Screenshot(context.Background(), d, dir)
	if err != nil || img.RGBAAt(0, 0) != (color.RGBA{1, 2, 3, 255}) {
		t.Fatalf("Screenshot: %v, %v", img, err)
	}
	if filepath.Dir(d.path) != dir || !strings.HasPrefix(filepath.Base(d.path), "screendump-") {
		t.Errorf("QEMU was told to write %s, not a fresh file in %s", d.path, dir)
	}
	if _, err := os.Stat(d.path); !os.IsNotExist(err) {
		t.Errorf("%s left behind: %v", d.path, err)
	}

	// A QEMU that puts a symlink there gets an error, not the file.
	secret := filepath.Join(t.TempDir(), "secret")
	os.WriteFile(secret, []byte("P6\n1 1\n255\nabc"), 0o600)
	d.write = func(p string) error { return os.Symlink(secret, p) }
	if _, err := Screenshot(context.Background(), d, dir); err == nil {
		t.Errorf("Screenshot followed a symlink QEMU made")
	}
	d.write = func(p string) error { return os.Mkdir(p, 0o700) }
	if _, err := Screenshot(context.Background(), d, dir); err == nil {
		t.Errorf("Screenshot read a directory")
	}
	d.write = func(string) error { return errors.New("no surface") }
	if _, err := Screenshot(context.Background(), d, dir); err == nil || !strings.Contains(err.Error(), "no surface") {
		t.Errorf("QEMU's error lost: %v", err)
	}
	if left, _ := os.ReadDir(dir); len(left) > 0 {
		t.Errorf("left in the state directory: %v", left)
	}
}

// passworder records the commands a ticket sends.
type passworder struct{ cmds bytes.Buffer }

func (p *passworder) SetVNCPassword(_ context.Context, pw string) error {
	p.cmds.WriteString("set " + pw + ";")
	return nil
}

func (p *passworder) ExpireVNCPassword(_ context.Context, when string) error {
	p.cmds.WriteString("expire " + when + ";")
	return nil
}

func TestTicket(t *testing.T) {
	var p passworder
	pw, err := Ticket(context.Background(), &p, 90_500_000_000)
	if err != nil || len(pw) != TicketLen || strings.Trim(pw, ticketAlphabet) != "" {
		t.Fatalf("Ticket: %q, %v", pw, err)
	}
	if want := "set " + pw + ";expire +91;"; p.cmds.String() != want {
		t.Errorf("commands %q, want %q", p.cmds.String(), want)
	}
	if again, _ := Ticket(context.Background(), &p, 0); again == pw {
		t.Errorf("two tickets alike: %q", pw)
	}
}
