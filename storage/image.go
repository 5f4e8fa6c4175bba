package storage

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"runtime"
	"strings"
	"syscall"
	"time"
)

// Tools are the host programs storage runs. The zero value uses qemu-img
// from PATH and the default timeouts.
type Tools struct {
	QemuImg string // default "qemu-img"
	// Timeout bounds each qemu-img call on a local image (default 10 s).
	Timeout time.Duration
	// RemoteTimeout bounds each probe of an iSCSI or RBD disk (default 20 s):
	// a dead Ceph monitor or a silent portal would otherwise hang forever.
	RemoteTimeout time.Duration
}

func (t Tools) qemuImg() string {
	if t.QemuImg == "" {
		return "qemu-img"
	}
	return t.QemuImg
}

func (t Tools) timeout(remote bool) time.Duration {
	switch {
	case remote && t.RemoteTimeout > 0:
		return t.RemoteTimeout
	case remote:
		return 20 * time.Second
	case t.Timeout > 0:
		return t.Timeout
	}
	return 10 * time.Second
}

var couldNotOpen = regexp.MustCompile(`^Could not open '(.*?)': (.*)$`)

// runTied runs cmd so that it ends with the vmsup that runs it: a qemu-img
// left running after vmsup was killed (a commit, a convert) would hold the
// image's lock against the command that finishes vmsup's work. The parent
// death signal follows the thread that forked, so that thread is held for
// the command's life.
func runTied(cmd *exec.Cmd) error {
	runtime.LockOSThread()
	defer runtime.UnlockOSThread()
	cmd.SysProcAttr = &syscall.SysProcAttr{Pdeathsig: syscall.SIGKILL}
	return cmd.Run()
}

// ErrInUse means another process holds QEMU's lock on an image (a running
// VM writes it).
var ErrInUse = errors.New("image is in use by another process")

// toolError is a failed qemu-img run: its last line of output.
type toolError struct{ msg string }

func (e *toolError) Error() string { return e.msg }

// run runs qemu-img with args under a timeout and returns its stdout. The
// error is its last line of stderr, without the "qemu-img: " prefix.
func (t Tools) run(ctx context.Context, remote bool, args ...string) ([]byte, error) {
	ctx, cancel := context.WithTimeout(ctx, t.timeout(remote))
	defer cancel()
	cmd := exec.CommandContext(ctx, t.qemuImg(), args...)
	var stdout, stderr bytes.Buffer
	cmd.Stdout, cmd.Stderr = &stdout, &stderr
	err := runTied(cmd)
	if ctx.Err() == context.DeadlineExceeded {
		return nil, fmt.Errorf("qemu-img %s: no answer within %s: %w", args[0], t.timeout(remote), context.DeadlineExceeded)
	}
	if err != nil {
		msg := strings.TrimPrefix(oneLine(stderr.String()), "qemu-img: ")
		// "Could not open 'driver=raw,file.driver=iscsi,...': CAUSE": the
		// caller names the image better than the option string does.
		if m := couldNotOpen.FindStringSubmatch(msg); m != nil && strings.Contains(m[1], "driver=") {
			msg = m[2]
		}
		if msg == "" {
			msg = err.Error()
		}
		if strings.Contains(stderr.String(), `Failed to get shared "write" lock`) || strings.Contains(stderr.String(), `Failed to get "write" lock`) {
			msg = strings.TrimPrefix(strings.SplitN(strings.TrimSpace(stderr.String()), "\n", 2)[0], "qemu-img: ")
			return nil, fmt.Errorf("%w (QEMU image lock): %s", ErrInUse, msg)
		}
		return nil, &toolError{msg}
	}
	return stdout.Bytes(), nil
}

// ImageInfo is what qemu-img info --output=json says about one image.
type ImageInfo struct {
	Filename            string `json:"filename"`
	Format              string `json:"format"`
	VirtualSize         int64  `json:"virtual-size"`
	ActualSize          int64  `json:"actual-size"`
	BackingFilename     string `json:"backing-filename"`
	FullBackingFilename string `json:"full-backing-filename"`
	BackingFormat       string `json:"backing-filename-format"`
}

// Backing returns the absolute path of the image's backing file, or "".
func (i ImageInfo) Backing() string {
	b := i.FullBackingFilename
	if b == "" {
		b = i.BackingFilename
	}
	if b != "" && !filepath.IsAbs(b) && !strings.Contains(b, ":") {
		b = filepath.Join(filepath.Dir(i.Filename), b)
	}
	return b
}

// Info inspects one image (without opening its backing file). format ""
// lets qemu-img probe; give it for images vmsup created. The image lock is
// honoured: an image a running QEMU writes gives ErrInUse.
func (t Tools) Info(ctx context.Context, path, format string) (ImageInfo, error) {
	args := []string{"info", "--output=json"}
	if format != "" {
		args = append(args, "-f", format)
	}
	out, err := t.run(ctx, false, append(args, path)...)
	if err != nil {
		return ImageInfo{}, err
	}
	var info ImageInfo
	if err := json.Unmarshal(out, &info); err != nil {
		return ImageInfo{}, fmt.Errorf("qemu-img info %s: %w", path, err)
	}
	if info.Filename == "" {
		info.Filename = path
	}
	return info, nil
}

// maxChain bounds backing chains (QEMU's own limit is 16 levels of
// format probing; a loop in the headers must not spin forever).
const maxChain = 64

// Chain resolves the backing chain of the image at path, top first: every
// file QEMU will open for it (an AppArmor profile must allow each). A
// missing backing file is an error naming it and the image that refers to
// it.
func (t Tools) Chain(ctx context.Context, path, format string) ([]ImageInfo, error) {
	var chain []ImageInfo
	seen := map[string]bool{}
	for path != "" {
		if len(chain) >= maxChain || seen[path] {
			return chain, fmt.Errorf("backing chain of %s loops or is longer than %d", chain[0].Filename, maxChain)
		}
		seen[path] = true
		info, ok, err := localInfo(path, format)
		if !ok {
			info, err = t.Info(ctx, path, format)
		}
		if err != nil {
			return chain, err
		}
		chain = append(chain, info)
		next := info.Backing()
		if next == "" {
			break
		}
		if !strings.HasPrefix(next, "/") {
			// A protocol URL (nbd:, rbd:...): QEMU opens it, vmsup cannot check it here.
			break
		}
		if _, err := os.Stat(next); err != nil {
			if errors.Is(err, os.ErrNotExist) {
				return chain, fmt.Errorf("backing file %s (of %s): no such file", next, info.Filename)
			}
			return chain, fmt.Errorf("backing file %s (of %s): %w", next, info.Filename, err)
		}
		path, format = next, info.BackingFormat
	}
	return chain, nil
}

// Create makes a new image at path: format qcow2 or raw, size bytes, and for
// an overlay a backing file (of backingFormat) that stays read-only. size 0
// with a backing file takes the base's size. It fails if path exists.
func (t Tools) Create(ctx context.Context, path, format string, size int64, backing, backingFormat string) error {
	return createAtomic(path, func(part string) error {
		args := []string{"create", "-q", "-f", format}
		if backing != "" {
			args = append(args, "-b", backing, "-F", backingFormat)
		}
		args = append(args, part)
		if size > 0 {
			args = append(args, fmt.Sprint(size))
		}
		_, err := t.run(ctx, false, args...)
		return err
	})
}
