package storage

import (
	"context"
	"encoding/json"
	"fmt"
)

// DataBytes is the guest data the image at path holds itself: its
// allocated extents that are not zero (qemu-img map), none of its backing
// file's. For a copy into a new image, it is what the copy really wrote,
// however large the disk's virtual size.
func (t Tools) DataBytes(ctx context.Context, path, format string) (int64, error) {
	out, err := t.run(ctx, false, "map", "--output=json", "-f", format, path)
	if err != nil {
		return 0, fmt.Errorf("qemu-img map %s: %w", path, err)
	}
	var extents []struct {
		Length int64 `json:"length"`
		Depth  int   `json:"depth"`
		Data   bool  `json:"data"`
		Zero   bool  `json:"zero"`
	}
	if err := json.Unmarshal(out, &extents); err != nil {
		return 0, fmt.Errorf("qemu-img map %s: %w", path, err)
	}
	var n int64
	for _, e := range extents {
		if e.Depth == 0 && e.Data && !e.Zero {
			n += e.Length
		}
	}
	return n, nil
}
