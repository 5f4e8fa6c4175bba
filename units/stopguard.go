package units

import "strings"

// WhileMainRuns wraps an ExecStop= command so that it runs only while the
// unit's main process lives. systemd runs ExecStop= also after the main
// process ended by itself, with $MAINPID unset; the wrapper's shell exits
// there in about a millisecond.
//
// The script has no "$", ";" or double quote: systemd 252 writes those
// into the transient unit's file escaped in a way its parser does not undo,
// so after a daemon-reload the command would be another one. An argv with
// such a character (or a single quote) is returned as it is, unguarded.
func WhileMainRuns(argv []string) []string {
	quoted := make([]string, len(argv))
	for i, a := range argv {
		if a == "" || strings.ContainsAny(a, "$;\"'\\%\n`") {
			return argv
		}
		quoted[i] = "'" + a + "'"
	}
	return []string{"/bin/sh", "-c", "printenv MAINPID >/dev/null || exit 0 && exec " + strings.Join(quoted, " ")}
}
