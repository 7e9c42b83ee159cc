package cli

import (
	"errors"
	"fmt"
	"regexp"
	"strings"

	"github.com/spf13/cobra"
	"github.com/spf13/pflag"
)

// cobraUsageHead is the start of cobra's usage template: a group (a command with
// subcommands) shows both "pgcoord leases [flags]" and "pgcoord leases [command]".
const cobraUsageHead = "Usage:{{if .Runnable}}\n  {{.UseLine}}{{end}}{{if .HasAvailableSubCommands}}\n  {{.CommandPath}} [command]{{end}}"

// usageHead shows a group as "pgcoord leases <command> [flags]" and any other command by
// its use line ("pgcoord leases list [flags]").
const usageHead = "Usage:{{if .HasAvailableSubCommands}}\n  {{.CommandPath}} <command> [flags]{{else}}\n  {{.UseLine}}{{end}}"

// setUpGroups makes root and every command with subcommands a group: run alone it prints its
// help; run with anything else it is a usage error naming the closest subcommands. (Cobra
// suggests only at the root, and runs a group's help for an unknown subcommand.)
func setUpGroups(root *cobra.Command) {
	root.InitDefaultCompletionCmd() // added at Execute otherwise, after this walk
	tmpl := strings.Replace(root.UsageTemplate(), cobraUsageHead, usageHead, 1)
	root.SetUsageTemplate(strings.Replace(tmpl, "{{.CommandPath}} [command] --help", "{{.CommandPath}} <command> --help", 1))
	var walk func(*cobra.Command)
	walk = func(c *cobra.Command) {
		if c.HasSubCommands() {
			c.SuggestionsMinimumDistance = 2 // cobra sets it at the root only
			if c.Run == nil && c.RunE == nil {
				c.Args = noSubcommand
				c.RunE = func(cmd *cobra.Command, _ []string) error { return cmd.Help() }
			}
		}
		for _, sub := range c.Commands() {
			walk(sub)
		}
	}
	walk(root)
}

// noSubcommand is the Args of a command that only groups subcommands: any argument is an
// unknown subcommand, a usage error (exit 2) with suggestions, rather than a reason to print
// help and exit 0.
func noSubcommand(cmd *cobra.Command, args []string) error {
	if len(args) == 0 {
		return nil
	}
	msg := fmt.Sprintf("unknown command %q for %q", args[0], cmd.CommandPath())
	if s := cmd.SuggestionsFor(args[0]); len(s) > 0 {
		msg += "; did you mean " + strings.Join(s, " or ") + "?"
	}
	return usageError{errors.New(msg)}
}

// negativeArg matches pflag's error for an argument such as -1, read as shorthand flags.
var negativeArg = regexp.MustCompile(`^unknown shorthand flag: '.' in (-[0-9][0-9.]*)$`)

// flagError makes a flag parsing error a usage error, suggesting the closest flag for a typo
// and explaining a negative number given as an argument.
func flagError(cmd *cobra.Command, err error) error {
	msg := err.Error()
	if m := negativeArg.FindStringSubmatch(msg); m != nil {
		return usagef("%s: %s is not a flag, and no argument of %s may be negative (usage: %s)",
			cmd.CommandPath(), m[1], cmd.CommandPath(), cmd.UseLine())
	}
	if name, ok := strings.CutPrefix(msg, "unknown flag: --"); ok {
		if s := closestFlag(cmd.Flags(), name); s != "" {
			msg += "; did you mean --" + s + "?"
		}
	}
	return usageError{errors.New(msg)}
}

// closestFlag returns the flag of fs nearest to name (at most 2 edits, or name a prefix of
// it), or "".
func closestFlag(fs *pflag.FlagSet, name string) string {
	best, bestDist := "", 3
	fs.VisitAll(func(f *pflag.Flag) {
		if f.Hidden {
			return
		}
		d := editDistance(name, f.Name)
		if strings.HasPrefix(f.Name, name) && d > 2 {
			d = 2
		}
		if d < bestDist {
			best, bestDist = f.Name, d
		}
	})
	return best
}

// editDistance is the Levenshtein distance between a and b (bytes; flag names are ASCII).
func editDistance(a, b string) int {
	prev := make([]int, len(b)+1)
	for j := range prev {
		prev[j] = j
	}
	for i := 1; i <= len(a); i++ {
		cur := make([]int, len(b)+1)
		cur[0] = i
		for j := 1; j <= len(b); j++ {
			cost := 1
			if a[i-1] == b[j-1] {
				cost = 0
			}
			cur[j] = min(prev[j]+1, cur[j-1]+1, prev[j-1]+cost)
		}
		prev = cur
	}
	return prev[len(b)]
}
