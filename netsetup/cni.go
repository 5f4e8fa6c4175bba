package netsetup

import (
	"context"
	"crypto/sha256"
	"encoding/hex"
	"errors"
	"fmt"
	"strings"

	"github.com/containernetworking/cni/libcni"
	types100 "github.com/containernetworking/cni/pkg/types/100"
	"github.com/vishvananda/netlink"
	"golang.org/x/sys/unix"
)

// DefaultCNIBinDirs returns the directories searched for plugin binaries
// when none are given: the CNI convention and Debian's
// containernetworking-plugins.
func DefaultCNIBinDirs() []string { return []string{"/opt/cni/bin", "/usr/lib/cni"} }

// CNI runs CNI network configurations through libcni.
type CNI struct {
	BinDirs  []string // plugin directories; nil = DefaultCNIBinDirs()
	CacheDir string   // libcni's result cache (CHECK and DEL need it); required
}

// CNIAttachment is one NIC's attachment: the arguments of ADD, CHECK and
// DEL, which must be the same for all three.
type CNIAttachment struct {
	Config      string `json:"config"`       // .conflist (or single-plugin .conf) path
	ContainerID string `json:"container_id"` // "vmsup-VM"
	IfName      string `json:"ifname"`       // interface the plugins make in the namespace
	Netns       string `json:"-"`            // namespace path as the caller sees it
}

// CNIResult is what ADD gave the NIC: the guest uses the address and
// gateway (the plugins put them on IfName, which only forwards frames).
type CNIResult struct {
	Addresses []string `json:"addresses,omitempty"` // CIDR, e.g. "10.22.0.5/24"
	Gateway   string   `json:"gateway,omitempty"`
	MTU       int      `json:"mtu,omitempty"`
}

// CNIIfName is the interface name the plugins get for the NIC named nic:
// "c" and 10 hex digits, stable and within IFNAMSIZ.
func CNIIfName(nic string) string {
	h := sha256.Sum256([]byte(nic))
	return "c" + hex.EncodeToString(h[:])[:10]
}

func (c CNI) config() *libcni.CNIConfig {
	dirs := c.BinDirs
	if len(dirs) == 0 {
		dirs = DefaultCNIBinDirs()
	}
	return libcni.NewCNIConfigWithCacheDir(dirs, c.CacheDir, nil)
}

// Load reads and checks a network configuration: it parses, and every
// plugin it names is installed and speaks its cniVersion.
func (c CNI) Load(ctx context.Context, path string) (*libcni.NetworkConfigList, error) {
	var (
		list *libcni.NetworkConfigList
		err  error
	)
	if strings.HasSuffix(path, ".conflist") {
		list, err = libcni.ConfListFromFile(path)
	} else {
		// Single-plugin .conf files are deprecated in libcni but still what
		// many set-ups ship; libcni turns one into a list.
		var one *libcni.PluginConfig
		//lint:ignore SA1019 see above
		if one, err = libcni.ConfFromFile(path); err == nil {
			//lint:ignore SA1019 see above
			list, err = libcni.ConfListFromConf(one)
		}
	}
	if err != nil {
		return nil, fmt.Errorf("CNI config %s: %w", path, err)
	}
	if list.Name == "" {
		return nil, fmt.Errorf("CNI config %s: no network name", path)
	}
	if _, err := c.config().ValidateNetworkList(ctx, list); err != nil {
		return nil, fmt.Errorf("CNI config %s: %w", path, err)
	}
	return list, nil
}

func (a CNIAttachment) runtime() *libcni.RuntimeConf {
	return &libcni.RuntimeConf{ContainerID: a.ContainerID, NetNS: a.Netns, IfName: a.IfName}
}

// Add runs ADD and returns the addresses the NIC got.
func (c CNI) Add(ctx context.Context, a CNIAttachment) (CNIResult, error) {
	list, err := c.Load(ctx, a.Config)
	if err != nil {
		return CNIResult{}, err
	}
	r, err := c.config().AddNetworkList(ctx, list, a.runtime())
	if err != nil {
		return CNIResult{}, fmt.Errorf("CNI ADD %s: %w", list.Name, err)
	}
	res, err := types100.NewResultFromResult(r)
	if err != nil {
		c.Del(ctx, a)
		return CNIResult{}, fmt.Errorf("CNI ADD %s: result: %w", list.Name, err)
	}
	var out CNIResult
	for _, ip := range res.IPs {
		out.Addresses = append(out.Addresses, ip.Address.String())
		if ip.Gateway != nil && out.Gateway == "" {
			out.Gateway = ip.Gateway.String()
		}
	}
	return out, nil
}

// Check runs CHECK against the result ADD cached.
func (c CNI) Check(ctx context.Context, a CNIAttachment) error {
	list, err := c.Load(ctx, a.Config)
	if err != nil {
		return err
	}
	if err := c.config().CheckNetworkList(ctx, list, a.runtime()); err != nil {
		return fmt.Errorf("CNI CHECK %s: %w", list.Name, err)
	}
	return nil
}

// Del runs DEL. The plugins treat a missing interface or lease as done, so
// it is safe to repeat; a config that no longer loads is an error.
func (c CNI) Del(ctx context.Context, a CNIAttachment) error {
	list, err := c.Load(ctx, a.Config)
	if err != nil {
		return err
	}
	if err := c.config().DelNetworkList(ctx, list, a.runtime()); err != nil {
		return fmt.Errorf("CNI DEL %s: %w", list.Name, err)
	}
	return nil
}

// WireTap makes tap in the namespace at netns and joins it to the
// interface ifname the CNI plugins made there with two tc mirred
// redirects (ingress of each to egress of the other), as Kata Containers
// does: frames pass between the guest and the CNI network untouched, the
// namespace's own IP stack never sees them, and the address the plugins
// put on ifname (which CHECK verifies) can stay. tap.MTU 0 takes ifname's.
func WireTap(netns string, tap Tap, ifname string) error {
	return InNetns(netns, func() error {
		peer, err := netlink.LinkByName(ifname)
		if err != nil {
			return fmt.Errorf("CNI interface %s: %w", ifname, err)
		}
		if tap.MTU == 0 {
			tap.MTU = peer.Attrs().MTU
		}
		if LinkExists(tap.Name) {
			if !IsTap(tap.Name) {
				return fmt.Errorf("tap %s: a link of that name exists and is not a tap", tap.Name)
			}
			if err := DeleteTap(tap.Name); err != nil {
				return err
			}
		}
		if err := CreateTap(tap); err != nil {
			return err
		}
		t, err := netlink.LinkByName(tap.Name)
		if err == nil {
			err = redirect(peer, t)
		}
		if err == nil {
			err = redirect(t, peer)
		}
		if err != nil {
			DeleteTap(tap.Name)
			return fmt.Errorf("tap %s <-> %s: %w", tap.Name, ifname, err)
		}
		return nil
	})
}

// redirect sends every frame arriving on from out of to.
func redirect(from, to netlink.Link) error {
	qd := &netlink.Ingress{QdiscAttrs: netlink.QdiscAttrs{
		LinkIndex: from.Attrs().Index, Handle: netlink.MakeHandle(0xffff, 0), Parent: netlink.HANDLE_INGRESS,
	}}
	if err := netlink.QdiscAdd(qd); err != nil && !errors.Is(err, unix.EEXIST) {
		return fmt.Errorf("ingress qdisc on %s: %w", from.Attrs().Name, err)
	}
	f := &netlink.U32{
		FilterAttrs: netlink.FilterAttrs{
			LinkIndex: from.Attrs().Index, Parent: netlink.MakeHandle(0xffff, 0), Protocol: unix.ETH_P_ALL,
		},
		Actions: []netlink.Action{&netlink.MirredAction{
			ActionAttrs:  netlink.ActionAttrs{Action: netlink.TC_ACT_STOLEN},
			MirredAction: netlink.TCA_EGRESS_REDIR,
			Ifindex:      to.Attrs().Index,
		}},
	}
	if err := netlink.FilterAdd(f); err != nil {
		return fmt.Errorf("redirect %s -> %s: %w", from.Attrs().Name, to.Attrs().Name, err)
	}
	return nil
}
