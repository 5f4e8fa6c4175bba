package qmp

// QEMU's states as QMP reports them, typed: a run state (query-status), a
// block job's status (query-jobs) and a migration's (query-migrate). The
// names are QEMU's (qapi/run-state.json, job.json, migration.json in 7.2).

// RunState is QEMU's run state.
type RunState string

// Run states.
const (
	RunRunning       RunState = "running"
	RunPaused        RunState = "paused"
	RunPrelaunch     RunState = "prelaunch"
	RunInMigrate     RunState = "inmigrate"
	RunPostMigrate   RunState = "postmigrate"
	RunFinishMigrate RunState = "finish-migrate"
	RunSuspended     RunState = "suspended"
	RunShutdown      RunState = "shutdown"
	RunGuestPanicked RunState = "guest-panicked"
	RunInternalError RunState = "internal-error"
	RunIOError       RunState = "io-error"
	RunRestoreVM     RunState = "restore-vm"
	RunSaveVM        RunState = "save-vm"
	RunDebug         RunState = "debug"
	RunWatchdog      RunState = "watchdog"
	RunColo          RunState = "colo"
)

// JobStatus is a block job's status.
type JobStatus string

// Job statuses.
const (
	JobCreated   JobStatus = "created"
	JobRunning   JobStatus = "running"
	JobPaused    JobStatus = "paused"
	JobReady     JobStatus = "ready"
	JobStandby   JobStatus = "standby"
	JobWaiting   JobStatus = "waiting"
	JobPending   JobStatus = "pending"
	JobAborting  JobStatus = "aborting"
	JobConcluded JobStatus = "concluded"
	JobNull      JobStatus = "null"
)

// MigrationStatus is a migration's status.
type MigrationStatus string

// Migration statuses.
const (
	MigrationNone           MigrationStatus = "none"
	MigrationSetup          MigrationStatus = "setup"
	MigrationActive         MigrationStatus = "active"
	MigrationPreSwitchover  MigrationStatus = "pre-switchover"
	MigrationDevice         MigrationStatus = "device"
	MigrationPostcopyActive MigrationStatus = "postcopy-active"
	MigrationPostcopyPaused MigrationStatus = "postcopy-paused"
	MigrationCompleted      MigrationStatus = "completed"
	MigrationFailed         MigrationStatus = "failed"
	MigrationCancelling     MigrationStatus = "cancelling"
	MigrationCancelled      MigrationStatus = "cancelled"
	MigrationWaitUnplug     MigrationStatus = "wait-unplug"
)
