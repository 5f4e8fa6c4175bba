package diskops

import (
	"context"
	"os"

	"github.com/vmsup/vmsup/internal/lifecycle/operation"
	"github.com/vmsup/vmsup/qmp"
)

// An export ends by being taken down: at its end as asked (committed:
// its bitmap goes, the next counts from its moment), or by recovery when
// its vmsup died (the client's read may not have finished: the bitmap is
// rolled back).

// exportAction is how an export is taken down (at its end, or by
// recovery when its vmsup died).
type exportAction uint8

const (
	exportTakeDown exportAction = iota + 1 // QEMU runs: exports, server, jobs, bitmaps, fleece nodes and files
	exportGone                             // QEMU is gone, and all it held with it: the socket and fleece files
	exportAskAgain                         // QEMU's monitor could not be had: the files go, the journal stays
)

func decideTakeDown(qemu qemuSeen) exportAction {
	switch qemu {
	case qemuAnswers:
		return exportTakeDown
	case qemuGone:
		return exportGone
	}
	return exportAskAgain
}

// bitmapAction is what becomes of a disk's export bitmaps when its export
// ends.
type bitmapAction uint8

const (
	bitmapKeep     bitmapAction = iota + 1 // a full export ended as asked: the next bitmap counts from its moment
	bitmapDropOld                          // an incremental one ended as asked: the exported bitmap goes, the next counts on
	bitmapRollBack                         // one that may not have been read: the exported bitmap records again, with what the next saw
	bitmapDropNew                          // a full one that may not have been read: the next bitmap goes (the next export is full)
)

// decideBitmaps: committed, the export ended as asked (else it failed, or
// its vmsup was killed); old is the bitmap it exported ("" for a full
// export).
func decideBitmaps(committed bool, old string) bitmapAction {
	switch {
	case committed && old == "":
		return bitmapKeep
	case committed:
		return bitmapDropOld
	case old != "":
		return bitmapRollBack
	}
	return bitmapDropNew
}

// takeDownExport ends an export: exports, server, jobs, fleece overlays,
// socket, and each disk's bitmaps as decideBitmaps says.
func (s *Service) takeDownExport(ctx context.Context, name string, in nbdIntent, committed bool) error {
	c, qemu, release, err := s.session(ctx, name)
	defer release()
	if a := decideTakeDown(qemu); a != exportTakeDown {
		os.Remove(in.Socket)
		for _, d := range in.Disks {
			os.Remove(d.Fleece)
		}
		if a == exportGone {
			return nil
		}
		return err
	}
	for _, d := range in.Disks {
		_ = c.BlockExportDel(ctx, nbdExportID(d.Disk), true)
	}
	_ = c.NBDServerStop(ctx)
	os.Remove(in.Socket)
	stopFleeceJobs(ctx, c, in, committed)
	removeFleece(ctx, c, in)
	return nil
}

// stopFleeceJobs cancels the copy-before-write jobs, then settles the
// bitmaps.
func stopFleeceJobs(ctx context.Context, c *qmp.Conn, in nbdIntent, committed bool) {
	for _, d := range in.Disks {
		id := nbdJobID(d.Disk)
		if jobs, err := c.QueryJobs(ctx); err == nil {
			if _, ok := jobByID(jobs, id); ok {
				_ = c.JobCancel(ctx, id)
				_, _ = qmp.WaitJob(ctx, c, id, func(j qmp.Job) bool { return j.Ended() }, nil)
				_ = c.JobDismiss(ctx, id)
			}
		}
		switch decideBitmaps(committed, d.Old) {
		case bitmapDropOld:
			_ = c.BlockDirtyBitmapRemove(ctx, d.Node, d.Old)
		case bitmapRollBack:
			// Old records again, and takes in what New saw meanwhile.
			_ = c.BlockDirtyBitmapEnable(ctx, d.Node, d.Old)
			_ = c.BlockDirtyBitmapMerge(ctx, d.Node, d.Old, []string{d.New})
			_ = c.BlockDirtyBitmapRemove(ctx, d.Node, d.New)
		case bitmapDropNew:
			_ = c.BlockDirtyBitmapRemove(ctx, d.Node, d.New)
		}
	}
}

// removeFleece deletes the fleece overlays' nodes, fd sets and files.
func removeFleece(ctx context.Context, c *qmp.Conn, in nbdIntent) {
	for _, d := range in.Disks {
		_ = c.BlockdevDel(ctx, fleeceNode(d.Fleece))
		_ = c.BlockdevDel(ctx, fleeceFile(d.Fleece))
		if sets, err := c.QueryFDSets(ctx); err == nil {
			for _, set := range sets {
				for _, fd := range set.FDs {
					if fd.Opaque == fleeceOpaque(d.Fleece) {
						_ = c.RemoveFD(ctx, set.FDSetID, nil)
					}
				}
			}
		}
		os.Remove(d.Fleece)
	}
}

// nbdRecovered is what recovery says of an export whose vmsup died (the
// CLI shows it).
const nbdRecovered = "the NBD export was taken down; its bitmap counts on from the export before"

// recoverNBDExport takes down an export whose vmsup died: the client's
// read may not have finished, so the bitmap is rolled back.
func (s *Service) recoverNBDExport(ctx context.Context, name string, op *operation.Op) (string, error) {
	in, err := operation.IntentOf[nbdIntent](op)
	if err != nil {
		return "", err
	}
	if err := s.takeDownExport(ctx, name, in, false); err != nil {
		return "", err
	}
	return nbdRecovered, nil
}
