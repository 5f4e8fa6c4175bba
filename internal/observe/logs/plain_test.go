package logs

import "testing"

// Plain leaves the words of what a guest writes on its console: systemd's
// coloured status, a shell's title and prompt colours, cursor moves, a
// character set switch, a sequence cut at the line's end.
func TestPlain(t *testing.T) {
	for _, c := range []struct{ in, want string }{
		{"plain\ttext", "plain\ttext"},
		{"[\x1b[0;32m  OK  \x1b[0m] Started \x1b[0;1;39mJournal Service\x1b[0m.", "[  OK  ] Started Journal Service."},
		{"\x1b]0;root@guest: ~\x07root@guest:~# ", "root@guest:~# "},
		{"\x1b]2;title\x1b\\after", "after"},
		{"\x1b[?25l\x1b[2K\x1b[1Gprogress 50%\x1b[?25h", "progress 50%"},
		{"\x1b(Bline\x1b7\x1b8", "line"},
		{"bell\x07 and del\x7f gone", "bell and del gone"},
		{"cut at the end \x1b[0;3", "cut at the end "},
		{"\x1b]0;cut title", ""},
		{"ünïcode \x1b[1mstays\x1b[0m", "ünïcode stays"},
	} {
		if got := Plain(c.in); got != c.want {
			t.Errorf("Plain(%q) = %q, want %q", c.in, got, c.want)
		}
	}
}
