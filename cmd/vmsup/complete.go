package main

import (
	"os"
	"path/filepath"
	"strings"

	"github.com/spf13/cobra"
)

// completions gives every command shell completion of its arguments: VM
// names for NAME, .toml files for FILE, both for NAME|FILE; and the enum
// values of flags that have them.
func completions(g *globals, root *cobra.Command) {
	var walk func(c *cobra.Command)
	walk = func(c *cobra.Command) {
		use := c.Use
		if c.ValidArgsFunction == nil && c != root {
			switch {
			case strings.Contains(use, "NAME|FILE"):
				c.ValidArgsFunction = g.completeVMs(true)
			case strings.Contains(use, " NAME"):
				c.ValidArgsFunction = g.completeVMs(false)
			case strings.Contains(use, " FILE"):
				c.ValidArgsFunction = func(*cobra.Command, []string, string) ([]string, cobra.ShellCompDirective) {
					return []string{"toml"}, cobra.ShellCompDirectiveFilterFileExt
				}
			}
		}
		for _, sub := range c.Commands() {
			walk(sub)
		}
	}
	walk(root)
	enum := func(values ...string) cobra.CompletionFunc {
		return func(*cobra.Command, []string, string) ([]string, cobra.ShellCompDirective) {
			return values, cobra.ShellCompDirectiveNoFileComp
		}
	}
	root.RegisterFlagCompletionFunc("qemu-user", enum("per-vm", "vmsup-qemu"))
	if c, _, err := root.Find([]string{"reboot"}); err == nil {
		c.RegisterFlagCompletionFunc("mode", enum("agent", "acpi"))
	}
}

// completeVMs completes the first argument with the names of the VMs vmsup
// knows (and, withFiles, .toml files).
func (g *globals) completeVMs(withFiles bool) cobra.CompletionFunc {
	return func(cmd *cobra.Command, args []string, prefix string) ([]string, cobra.ShellCompDirective) {
		var out []string
		dirs := false
		if sup, err := g.supervisor(); err == nil {
			names, _ := sup.Names()
			sup.Close()
			for _, n := range names {
				if strings.HasPrefix(n, prefix) {
					out = append(out, n)
				}
			}
		}
		if withFiles {
			dir, base := filepath.Split(prefix)
			ents, _ := os.ReadDir(orDot(dir))
			for _, e := range ents {
				n := e.Name()
				if strings.HasPrefix(n, base) && (e.IsDir() || strings.HasSuffix(n, ".toml")) && !strings.HasPrefix(n, ".") {
					if e.IsDir() {
						n += "/"
						dirs = true
					}
					out = append(out, dir+n)
				}
			}
		}
		if dirs { // "dir/" goes on into the directory
			return out, cobra.ShellCompDirectiveNoFileComp | cobra.ShellCompDirectiveNoSpace
		}
		return out, cobra.ShellCompDirectiveNoFileComp
	}
}

func orDot(dir string) string {
	if dir == "" {
		return "."
	}
	return dir
}
