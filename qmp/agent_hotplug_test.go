package qmp

import (
	"context"
	"testing"
)

// The hot-plug commands send qemu-ga's argument names and read its
// answers (the real agent onlines a guest's vCPUs and memory in
// supervisor's TestResizeOnlinesByAgent).
func TestAgentOnlineCommands(t *testing.T) {
	t.Parallel()
	sock := fakeAgent(t, "", "", func(cmd fakeCmd) agentReply {
		args := string(cmd.Arguments)
		switch cmd.Execute {
		case "guest-set-vcpus":
			if args != `{"vcpus":[{"logical-id":1,"online":true}]}` {
				break
			}
			return agentReply{out: `{"return": 1}` + "\n"}
		case "guest-get-memory-block-info":
			return agentReply{out: `{"return": {"size": 134217728}}` + "\n"}
		case "guest-get-memory-blocks":
			return agentReply{out: `{"return": [{"phys-index": 0, "online": true, "can-offline": false}, {"phys-index": 32, "online": false}]}` + "\n"}
		case "guest-set-memory-blocks":
			if args != `{"mem-blks":[{"phys-index":32,"online":true}]}` {
				break
			}
			return agentReply{out: `{"return": [{"phys-index": 32, "response": "operation-failed", "error-code": 16}]}` + "\n"}
		}
		return agentReply{out: `{"error": {"class": "GenericError", "desc": "unexpected ` + cmd.Execute + " " + args + `"}}` + "\n"}
	})
	a, err := DialAgent(context.Background(), sock)
	if err != nil {
		t.Fatal(err)
	}
	defer a.Close()
	ctx := context.Background()
	if n, err := a.SetVCPUs(ctx, []GuestVCPU{{LogicalID: 1, Online: true}}); err != nil || n != 1 {
		t.Errorf("SetVCPUs = %d, %v", n, err)
	}
	if sz, err := a.MemoryBlockSize(ctx); err != nil || sz != 128<<20 {
		t.Errorf("MemoryBlockSize = %d, %v", sz, err)
	}
	bs, err := a.MemoryBlocks(ctx)
	if err != nil || len(bs) != 2 || bs[1].PhysIndex != 32 || bs[1].Online || bs[1].CanOffline != nil || *bs[0].CanOffline {
		t.Errorf("MemoryBlocks = %+v, %v", bs, err)
	}
	rs, err := a.SetMemoryBlocks(ctx, []GuestMemoryBlock{{PhysIndex: 32, Online: true}})
	if err != nil || len(rs) != 1 || rs[0].Response != "operation-failed" || rs[0].ErrorCode != 16 {
		t.Errorf("SetMemoryBlocks = %+v, %v", rs, err)
	}
}
