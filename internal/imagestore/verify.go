package imagestore

import (
	"bytes"
	"context"
	"crypto/sha256"
	"encoding/json"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"time"

	"github.com/vmsup/vmsup/internal/util/atomicfile"
)

// ErrBadImage: qemu-img refuses the image as a base for VM disks.
var ErrBadImage = errors.New("not an image vmsup stores")

// ErrTooLarge: the image's virtual size is over the store's bound.
var ErrTooLarge = errors.New("virtual size over the image store's bound")

// SizeError says an image's virtual size is over the bound.
type SizeError struct {
	Size, Max int64
}

func (e *SizeError) Error() string {
	return fmt.Sprintf("virtual size %s (%d bytes) is over the image store's bound of %s (--max-virtual-size)",
		iec(e.Size), e.Size, iec(e.Max))
}

func (e *SizeError) Unwrap() error { return ErrTooLarge }

// iec writes n bytes in the largest binary unit it is a whole multiple of
// ("1PiB"), else in bytes.
func iec(n int64) string {
	for i, u := range []string{"EiB", "PiB", "TiB", "GiB", "MiB", "KiB"} {
		if unit := int64(1) << (60 - 10*i); n >= unit && n%unit == 0 {
			return fmt.Sprintf("%d%s", n/unit, u)
		}
	}
	return fmt.Sprintf("%dB", n)
}

// maxVirtualSize is the bound of s.
func (s Store) maxVirtualSize() int64 {
	if s.MaxVirtualSize > 0 {
		return s.MaxVirtualSize
	}
	return DefaultMaxVirtualSize
}

// verifyTimeout bounds qemu-img's look at a fetched image.
const verifyTimeout = 5 * time.Minute

// imgInfo is what the verification reads of qemu-img info.
type imgInfo struct {
	Format          string `json:"format"`
	VirtualSize     int64  `json:"virtual-size"`
	BackingFilename string `json:"backing-filename"`
	FormatSpecific  struct {
		Type string `json:"type"`
		Data struct {
			DataFile string `json:"data-file"`
		} `json:"data"`
	} `json:"format-specific"`
}

// verify checks the fetched file at path with qemu-img: a qcow2 or raw
// image (probed: a file that is another format is refused, not read as
// raw), a virtual size within the store's bound (from the header: qemu-img
// info neither follows a backing file nor connects anywhere), no backing file and no external data file (either
// would have QEMU open a host file the image names), and for a qcow2 a
// clean qemu-img check.
func (s Store) verify(ctx context.Context, path string) (imgInfo, error) {
	ctx, cancel := context.WithTimeout(ctx, verifyTimeout)
	defer cancel()
	qi := s.Tools.QemuImg
	if qi == "" {
		qi = "qemu-img"
	}
	var info imgInfo
	out, err := run(ctx, qi, "info", "--output=json", path)
	if err != nil {
		return info, err
	}
	if err := json.Unmarshal(out, &info); err != nil {
		return info, fmt.Errorf("qemu-img info: %w", err)
	}
	switch {
	case info.Format != "qcow2" && info.Format != "raw":
		return info, fmt.Errorf("%w: format %q (want qcow2 or raw)", ErrBadImage, info.Format)
	case info.VirtualSize <= 0:
		return info, fmt.Errorf("%w: no virtual size", ErrBadImage)
	case info.BackingFilename != "":
		return info, fmt.Errorf("%w: it names a backing file (%s)", ErrBadImage, info.BackingFilename)
	case info.FormatSpecific.Data.DataFile != "":
		return info, fmt.Errorf("%w: it names an external data file (%s)", ErrBadImage, info.FormatSpecific.Data.DataFile)
	case info.VirtualSize > s.maxVirtualSize():
		return info, &SizeError{Size: info.VirtualSize, Max: s.maxVirtualSize()}
	}
	if info.Format == "qcow2" {
		if _, err := run(ctx, qi, "check", "-f", "qcow2", path); err != nil {
			return info, fmt.Errorf("%w: %v", ErrBadImage, err)
		}
	}
	return info, nil
}

func run(ctx context.Context, name string, args ...string) ([]byte, error) {
	var stdout, stderr bytes.Buffer
	cmd := exec.CommandContext(ctx, name, args...)
	cmd.Stdout, cmd.Stderr = &stdout, &stderr
	if err := cmd.Run(); err != nil {
		msg := bytes.TrimSpace(stderr.Bytes())
		if i := bytes.IndexByte(msg, '\n'); i >= 0 {
			msg = msg[:i]
		}
		return nil, fmt.Errorf("%s %s: %v: %s", name, args[0], err, msg)
	}
	return stdout.Bytes(), nil
}

// add verifies the fetched file at path and moves it into the store under
// its sha256 (read-only, 0644); verified says how its bytes were checked
// ("sha512:HEX", the OCI digest). On error the caller removes path.
func (s Store) add(ctx context.Context, path, source, verified string) (Image, error) {
	info, err := s.verify(ctx, path)
	if err != nil {
		return Image{}, err
	}
	sum, err := hashFile(path, sha256.New())
	if err != nil {
		return Image{}, err
	}
	st, err := os.Stat(path)
	if err != nil {
		return Image{}, err
	}
	im := Image{Digest: "sha256:" + sum, Format: info.Format, VirtualSize: info.VirtualSize, Size: st.Size(),
		Source: source, Verified: verified, Pulled: time.Now().UTC()}
	l, err := s.lock(ctx)
	if err != nil {
		return Image{}, err
	}
	defer l.Unlock()
	if err := os.Chmod(path, 0o644); err != nil {
		return Image{}, err
	}
	if err := os.Rename(path, s.Path(im.Digest)); err != nil {
		return Image{}, err
	}
	b, err := json.MarshalIndent(im, "", "  ")
	if err != nil {
		return Image{}, err
	}
	if err := atomicfile.WriteFile(s.metaPath(im.Digest), append(b, '\n'), 0o600); err != nil {
		return Image{}, err
	}
	im.Path = s.Path(im.Digest)
	return im, nil
}
