package qmp

import "context"

// Onlining hot-plugged vCPUs and memory in the guest: QEMU plugs them, the
// guest's kernel sees them (an ACPI event each) and leaves them offline
// unless a rule of the guest's onlines them. qemu-ga can online them
// (guest-set-vcpus, guest-set-memory-blocks: a write to sysfs).

// SetVCPUs asks the guest to bring vs online or offline (by logical-id;
// can-offline is ignored) and returns how many it did: qemu-ga stops at
// the first that fails, and fails only when that is the first.
func (a *Agent) SetVCPUs(ctx context.Context, vs []GuestVCPU) (int, error) {
	args := struct {
		VCPUs []GuestVCPU `json:"vcpus"`
	}{vs}
	var n int
	err := a.Execute(ctx, "guest-set-vcpus", args, &n)
	return n, err
}

// GuestMemoryBlock is one entry of guest-get-memory-blocks: a block of the
// guest's memory as its kernel sees it (/sys/devices/system/memory).
type GuestMemoryBlock struct {
	PhysIndex  uint64 `json:"phys-index"`
	Online     bool   `json:"online"`
	CanOffline *bool  `json:"can-offline,omitempty"`
}

// GuestMemoryBlockResponse is guest-set-memory-blocks' answer for one
// block.
type GuestMemoryBlockResponse struct {
	PhysIndex uint64 `json:"phys-index"`
	// Response is "success", "not-found", "operation-not-supported" or
	// "operation-failed" (then ErrorCode is the guest's errno).
	Response  string `json:"response"`
	ErrorCode int    `json:"error-code,omitempty"`
}

// MemoryBlocks lists the guest's memory blocks.
func (a *Agent) MemoryBlocks(ctx context.Context) ([]GuestMemoryBlock, error) {
	var bs []GuestMemoryBlock
	err := a.Execute(ctx, "guest-get-memory-blocks", nil, &bs)
	return bs, err
}

// MemoryBlockSize is the size of one of the guest's memory blocks in
// bytes (guest-get-memory-block-info).
func (a *Agent) MemoryBlockSize(ctx context.Context) (uint64, error) {
	var info struct {
		Size uint64 `json:"size"`
	}
	err := a.Execute(ctx, "guest-get-memory-block-info", nil, &info)
	return info.Size, err
}

// SetMemoryBlocks asks the guest to bring bs online or offline (by
// phys-index; can-offline is ignored) and answers for each.
func (a *Agent) SetMemoryBlocks(ctx context.Context, bs []GuestMemoryBlock) ([]GuestMemoryBlockResponse, error) {
	args := struct {
		Blocks []GuestMemoryBlock `json:"mem-blks"`
	}{bs}
	var rs []GuestMemoryBlockResponse
	err := a.Execute(ctx, "guest-set-memory-blocks", args, &rs)
	return rs, err
}
