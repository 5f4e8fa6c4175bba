package netsetup

import (
	"fmt"

	"github.com/vishvananda/netlink"
)

// SetLoopbackUp brings lo up in the namespace at path.
func SetLoopbackUp(path string) error {
	return InNetns(path, func() error {
		lo, err := netlink.LinkByName("lo")
		if err == nil {
			err = netlink.LinkSetUp(lo)
		}
		if err != nil {
			return fmt.Errorf("netns %s: lo up: %w", path, err)
		}
		return nil
	})
}
