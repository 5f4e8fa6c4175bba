package imagestore

import (
	"context"
	"errors"
	"fmt"
	"os"
	"slices"

	"github.com/vmsup/vmsup/internal/lifecycle/startplan"
	"github.com/vmsup/vmsup/internal/lifecycle/steps"
	"github.com/vmsup/vmsup/spec"
)

// Step is the start step that makes the overlays of disks on stored
// images; it runs before the storage step (vmdisks).
const Step = "images"

// Start is the image store's part of a start: each file disk with an
// `image` key gets its file made, at its first start, as a qcow2 overlay
// on the stored image (of the disk's size when larger than the image's);
// an existing file must be on that image (a disk keeps the image it was
// made on).
type Start struct{ Store Store }

var _ startplan.Contributor = Start{}

// Steps is the images step; its undo removes the overlays it made.
func (st Start) Steps(f *spec.File, plan *startplan.Plan) []steps.Step {
	var made []string
	return []steps.Step{{
		Name: Step,
		Do: func(ctx context.Context) error {
			return st.each(f, plan.Boot, func(i int, d spec.Disk) error {
				created, err := st.Store.Overlay(ctx, d)
				if created {
					made = append(made, d.File)
					return plan.Paths.NoteMade(d.File) // (rm --delete-disks may delete it)
				}
				return err
			})
		},
		Undo: func(context.Context) {
			for _, p := range made {
				os.Remove(p)
			}
			made = nil
		},
	}}
}

// Check checks f's image disks before a start: each names a stored image
// (of no more than a new disk's size). One error per disk, at its key.
// Whether an existing disk is on it is the start's to check (the images
// step), and plan's to say of a running VM (an impossible change).
func (st Start) Check(f *spec.File) error {
	return st.each(f, startplan.Boot{}, func(i int, d spec.Disk) error {
		im, err := st.Store.Resolve(d.Image)
		if err != nil {
			return err
		}
		return sizeFits(d, im)
	})
}

func sizeFits(d spec.Disk, im Image) error {
	if _, err := os.Stat(d.File); err != nil && d.Size != 0 && int64(d.Size) < im.VirtualSize {
		return fmt.Errorf("size %s is less than image %q's %s", d.Size, d.Image, spec.Size(im.VirtualSize))
	}
	return nil
}

// each runs fn on f's image disks the start opens as written (a moved
// disk is elsewhere, on the image it was made on), joining its errors at
// the disks' image keys.
func (st Start) each(f *spec.File, boot startplan.Boot, fn func(i int, d spec.Disk) error) error {
	var errs []error
	for i, d := range f.VM.Disks {
		if d.Type != spec.DiskFile || d.Image == "" || f.Broken(fmt.Sprintf("disk[%d]", i)) {
			continue
		}
		if _, moved := boot.Moved[d.Name]; moved {
			continue
		}
		if err := fn(i, d); err != nil {
			errs = append(errs, f.Errorf(fmt.Sprintf("disk[%d].image", i), "disk %q: %v", d.Name, err))
		}
	}
	return f.Join(errs...)
}

// ErrOtherImage: a disk's existing file is not on the image it names.
var ErrOtherImage = errors.New("an existing disk keeps the image it was made on")

// overlayOf resolves d's image and checks d's file, when it exists, is on
// it; exists says whether it does.
func (s Store) overlayOf(ctx context.Context, d spec.Disk) (im Image, err error) {
	if im, err = s.Resolve(d.Image); err != nil {
		return im, err
	}
	if _, err := os.Stat(d.File); err != nil {
		return im, sizeFits(d, im)
	}
	if !slices.Contains(chain(ctx, d.File), im.Path) {
		return im, fmt.Errorf("%w: %s is not on %q (%s); give the disk another file to make it on this image", ErrOtherImage, d.File, d.Image, im.Digest)
	}
	return im, nil
}

// Overlay makes d's file a qcow2 overlay on its stored image when it does
// not exist (created reports it), growing it to d's size; an existing file
// is checked to be on the image.
func (s Store) Overlay(ctx context.Context, d spec.Disk) (created bool, err error) {
	im, err := s.overlayOf(ctx, d)
	if err != nil {
		return false, err
	}
	if _, err := os.Stat(d.File); err == nil {
		return false, nil
	}
	if err := s.Tools.Create(ctx, d.File, spec.FormatQcow2, int64(d.Size), im.Path, im.Format); err != nil {
		return false, err
	}
	return true, nil
}
