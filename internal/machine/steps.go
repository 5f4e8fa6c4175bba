package machine

import (
	"github.com/vmsup/vmsup/internal/lifecycle/steps"
)

// Multi-step operations run as internal/lifecycle/steps lists.

// step is one named part of a start or other multi-part operation.
type step = steps.Step

// StepError is a failed step of a multi-step operation on one VM.
type StepError = steps.Error

// errStopHere ends a sequence successfully after the step that returns it.
var errStopHere = steps.ErrStopHere
