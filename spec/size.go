package spec

import (
	"errors"
	"fmt"
	"strconv"
	"strings"
	"time"
)

// Size is a number of bytes. In TOML it is written as a string with an
// optional binary suffix: "512M", "4G", "1024K", "1T" (powers of 1024; "4GiB"
// too), or a plain integer of bytes. "1GB" and the other decimal SI forms
// are refused (ParseSize).
type Size int64

// Common sizes.
const (
	KiB Size = 1 << 10
	MiB Size = 1 << 20
	GiB Size = 1 << 30
	TiB Size = 1 << 40
)

// valueError is a bad value text; Parse maps it back to its key.
type valueError struct{ text, msg string }

func (e *valueError) Error() string { return e.msg }

// sizeUnit is a binary suffix and the power of 1024 it stands for.
type sizeUnit struct {
	suffix string
	mult   Size
	power  string
}

// sizeUnits are the binary suffixes, largest first.
func sizeUnits() []sizeUnit {
	return []sizeUnit{{"T", TiB, "1024^4"}, {"G", GiB, "1024^3"}, {"M", MiB, "1024^2"}, {"K", KiB, "1024"}}
}

// ParseSize parses a size with a binary suffix: "512M", "4G", "4GiB",
// "512MiB", "1T", "1024K", or plain bytes ("100"). The decimal SI forms
// ("1GB", "256MB", "1kB") are refused, not guessed: a "GB" is 1000^3 to a
// disk vendor and 1024^3 to many a user.
func ParseSize(s string) (Size, error) {
	t := strings.TrimSpace(s)
	if t == "" {
		return 0, fmt.Errorf("empty size")
	}
	num, mult, err := splitUnit(s, t)
	if err != nil {
		return 0, err
	}
	n, err := strconv.ParseInt(strings.TrimSpace(num), 10, 64)
	if err != nil {
		return 0, fmt.Errorf("invalid size %q (want e.g. \"512M\" or \"4G\")", s)
	}
	if n < 0 {
		return 0, fmt.Errorf("negative size %q", s)
	}
	if n > int64(1<<62)/int64(mult) {
		return 0, fmt.Errorf("size %q too large", s)
	}
	return Size(n) * mult, nil
}

// splitUnit cuts t (s trimmed) into its number and the multiplier of its
// suffix.
func splitUnit(s, t string) (string, Size, error) {
	upper := strings.ToUpper(t)
	units := sizeUnits()
	for i, u := range units {
		switch {
		case strings.HasSuffix(upper, u.suffix+"IB"):
			return t[:len(t)-3], u.mult, nil
		case strings.HasSuffix(upper, u.suffix+"B"):
			return "", 0, ambiguousSize(s, t[:len(t)-2], units, i)
		case strings.HasSuffix(upper, u.suffix):
			return t[:len(t)-1], u.mult, nil
		}
	}
	if strings.HasSuffix(upper, "B") {
		return t[:len(t)-1], 1, nil // "512B": bytes
	}
	return t, 1, nil
}

// ambiguousSize refuses s, a number num with the decimal suffix of
// units[i] ("1GB"), naming the binary size it may have meant and the same
// count of thousands one unit down.
func ambiguousSize(s, num string, units []sizeUnit, i int) error {
	n, err := strconv.ParseInt(strings.TrimSpace(num), 10, 64)
	if err != nil || n < 0 {
		return fmt.Errorf("invalid size %q (want e.g. \"512M\" or \"4G\"; sizes are binary, without \"B\")", s)
	}
	u := units[i]
	msg := fmt.Sprintf("%q is ambiguous: write \"%d%s\" (%siB, %s)", s, n, u.suffix, u.suffix, u.power)
	if n <= 1<<40 {
		down := ""
		if i+1 < len(units) {
			down = units[i+1].suffix
		}
		msg += fmt.Sprintf(" or \"%d%s\"", n*1000, down)
	}
	return errors.New(msg)
}

// UnmarshalText implements encoding.TextUnmarshaler for TOML strings.
func (s *Size) UnmarshalText(b []byte) error {
	v, err := ParseSize(string(b))
	if err != nil {
		return &valueError{string(b), err.Error()}
	}
	*s = v
	return nil
}

// MarshalText writes the shortest exact form ("512M").
func (s Size) MarshalText() ([]byte, error) { return []byte(s.String()), nil }

// String renders the size with the largest exact binary suffix.
func (s Size) String() string {
	for _, u := range sizeUnits() {
		if s != 0 && s%u.mult == 0 {
			return strconv.FormatInt(int64(s/u.mult), 10) + u.suffix
		}
	}
	return strconv.FormatInt(int64(s), 10)
}

// MiB returns the size in whole MiB, rounded up.
func (s Size) MiB() int64 { return int64((s + MiB - 1) / MiB) }

// Duration is a time.Duration written in TOML as "30s", "2m".
type Duration time.Duration

// UnmarshalText implements encoding.TextUnmarshaler.
func (d *Duration) UnmarshalText(b []byte) error {
	v, err := time.ParseDuration(string(b))
	if err != nil {
		return &valueError{string(b), fmt.Sprintf("invalid duration %q (want e.g. \"30s\" or \"2m\")", string(b))}
	}
	*d = Duration(v)
	return nil
}

// MarshalText implements encoding.TextMarshaler.
func (d Duration) MarshalText() ([]byte, error) { return []byte(time.Duration(d).String()), nil }

// D returns the value as a time.Duration.
func (d Duration) D() time.Duration { return time.Duration(d) }
