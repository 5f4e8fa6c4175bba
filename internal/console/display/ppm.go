package display

import (
	"bufio"
	"errors"
	"fmt"
	"image"
	"image/color"
	"io"
)

// MaxSide bounds a screendump's width and height (QEMU's largest display
// modes are far below): a PPM claiming more is refused before any memory
// is spent on it.
const MaxSide = 16384

// ErrNotPPM is the error of a file that is not a binary PPM (P6, maxval
// up to 255) as QEMU's screendump writes.
var ErrNotPPM = errors.New("not a binary PPM (P6, maxval 1..255)")

// DecodePPM reads a binary PPM: "P6", width, height, maxval (whitespace
// and # comments between), one whitespace byte, then width*height RGB
// triples. Samples are scaled to 0..255.
func DecodePPM(r io.Reader) (*image.RGBA, error) {
	br := bufio.NewReader(r)
	magic := make([]byte, 2)
	if _, err := io.ReadFull(br, magic); err != nil || string(magic) != "P6" {
		return nil, ErrNotPPM
	}
	var hdr [3]int
	for i := range hdr {
		n, err := ppmInt(br)
		if err != nil {
			return nil, fmt.Errorf("%w: header: %v", ErrNotPPM, err)
		}
		hdr[i] = n
	}
	w, h, maxval := hdr[0], hdr[1], hdr[2]
	switch {
	case w < 1 || h < 1 || w > MaxSide || h > MaxSide:
		return nil, fmt.Errorf("%w: size %dx%d (at most %d on a side)", ErrNotPPM, w, h, MaxSide)
	case maxval < 1 || maxval > 255:
		return nil, fmt.Errorf("%w: maxval %d", ErrNotPPM, maxval)
	}
	img := image.NewRGBA(image.Rect(0, 0, w, h))
	row := make([]byte, 3*w)
	for y := 0; y < h; y++ {
		if _, err := io.ReadFull(br, row); err != nil {
			return nil, fmt.Errorf("%w: row %d of %d: %v", ErrNotPPM, y, h, err)
		}
		for x := 0; x < w; x++ {
			img.SetRGBA(x, y, color.RGBA{scale(row[3*x], maxval), scale(row[3*x+1], maxval), scale(row[3*x+2], maxval), 0xff})
		}
	}
	return img, nil
}

func scale(v byte, maxval int) uint8 {
	if maxval == 255 {
		return v
	}
	return uint8(min(int(v), maxval) * 255 / maxval)
}

// ppmInt reads one header number: whitespace and comments, digits, and the
// one whitespace byte that ends it.
func ppmInt(br *bufio.Reader) (int, error) {
	n, digits := 0, 0
	for {
		b, err := br.ReadByte()
		if err != nil {
			return 0, err
		}
		switch {
		case b >= '0' && b <= '9':
			if n > MaxSide*MaxSide {
				return 0, errors.New("number too large")
			}
			n, digits = n*10+int(b-'0'), digits+1
		case b == '#' && digits == 0:
			if _, err := br.ReadString('\n'); err != nil {
				return 0, err
			}
		case isSpace(b) && digits == 0:
		case isSpace(b):
			return n, nil
		default:
			return 0, fmt.Errorf("unexpected byte %q", b)
		}
	}
}

func isSpace(b byte) bool {
	return b == ' ' || b == '\t' || b == '\n' || b == '\r' || b == '\v' || b == '\f'
}
