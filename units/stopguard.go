package units

// WhileMainRuns wraps an ExecStop= command so that it runs only while the
// unit's main process lives. systemd runs ExecStop= also after the main
// process ended by itself, with $MAINPID unset; the wrapper's shell exits
// there in about a millisecond. systemd expands only ${VAR} and a whole
// word $VAR in an argv, so the script's $MAINPID is the shell's to read.
func WhileMainRuns(argv []string) []string {
	return append([]string{"/bin/sh", "-c", `[ -n "$MAINPID" ] || exit 0; exec "$0" "$@"`}, argv...)
}
