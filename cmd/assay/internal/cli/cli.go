// Package cli is what the two binaries of cmd/assay share: assay, the
// operator's tool, and assay-dev, the development commands. It reads
// their command lines, says what was mistyped, maps errors to exit
// statuses, and holds the few helpers both print with and the tenant's
// client of a cell's HTTP API.
package cli

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"io"
	"os"
	"os/signal"
	"slices"
	"strings"
	"syscall"

	"assay.dev/pkg/config"
)

// ConfigError marks a bad setting, or a refusal (a move of live traffic
// the rollout fence refused), which exits 2.
type ConfigError struct{ Err error }

func (e ConfigError) Error() string { return e.Err.Error() }

func (e ConfigError) Unwrap() error { return e.Err }

// Tool is one binary's commands.
type Tool struct {
	// Name is the binary's name as its messages give it: assay, assay-dev.
	Name string
	// Usage is printed for help, for no command and for an unknown one.
	Usage string
	// Helps are each command's own help, printed for -h or --help; the
	// commands are its keys.
	Helps map[string]string
	// Subcommands are the commands each command with commands of its
	// own takes, so a mistyped one is named, --help or not.
	Subcommands map[string][]string
	// Moved are commands that are no longer in this binary, each with
	// where it is now. Asked for one, the binary says so and exits 2.
	Moved map[string]string
}

// Main runs the command args name with run, which prints to os.Stdout,
// and returns the exit status: 0, 2 for a bad setting or a refusal
// (ConfigError, or a setting config finds invalid), 1 for a failure. The
// errors go to stderr. run is given a context that ends on SIGTERM or
// an interrupt.
func (t *Tool) Main(args []string, stderr io.Writer, run func(ctx context.Context, cmd string, args []string) error) int {
	if len(args) == 0 {
		fmt.Fprint(stderr, t.Usage)
		return 2
	}
	if where, ok := t.Moved[args[0]]; ok {
		fmt.Fprintf(stderr, "%s %s: %s\n", t.Name, args[0], where)
		return 2
	}
	if slices.Contains([]string{"help", "-h", "--help"}, args[0]) {
		fmt.Print(t.Usage)
		return 0
	}
	if _, known := t.Helps[args[0]]; !known {
		fmt.Fprint(stderr, t.unknownCommand(args[0]))
		return 2
	}
	if err := t.checkSubcommand(args[0], args[1:]); err != nil {
		fmt.Fprintf(stderr, "%s %s: %v\n", t.Name, args[0], err)
		return 2
	}
	if IsHelp(args[1:]) {
		fmt.Print(t.Helps[args[0]])
		return 0
	}
	ctx, stop := signal.NotifyContext(context.Background(), syscall.SIGTERM, os.Interrupt)
	defer stop()
	err := run(ctx, args[0], args[1:])
	if errors.Is(err, flag.ErrHelp) {
		fmt.Print(t.Helps[args[0]])
		return 0
	}
	if err != nil {
		fmt.Fprintf(stderr, "%s %s: %v\n", t.Name, args[0], err)
		if _, ok := err.(ConfigError); ok || config.IsInvalid(err) {
			return 2
		}
		return 1
	}
	return 0
}

// checkSubcommand refuses a subcommand cmd does not have.
func (t *Tool) checkSubcommand(cmd string, args []string) error {
	subs, ok := t.Subcommands[cmd]
	if !ok || len(args) == 0 || IsHelp(args[:1]) || slices.Contains(subs, args[0]) {
		return nil
	}
	return t.UnknownSub(cmd, args)
}

// UnknownSub is the error of a command given no subcommand, or one it
// does not have: what it was given, what it takes, and its usage.
func (t *Tool) UnknownSub(cmd string, args []string) error {
	subs := strings.Join(t.Subcommands[cmd], ", ")
	if len(args) == 0 {
		return ConfigError{fmt.Errorf("%s needs a command: %s\n%s", cmd, subs, t.Helps[cmd])}
	}
	return ConfigError{fmt.Errorf("unknown %s command %q (it takes %s)\n%s", cmd, args[0], subs, t.Helps[cmd])}
}

// unknownCommand says what was not a command, and which one was likely
// meant.
func (t *Tool) unknownCommand(name string) string {
	for _, guess := range []string{name + "s", strings.TrimSuffix(name, "s")} {
		if _, ok := t.Helps[guess]; ok && guess != name {
			return fmt.Sprintf("%s: unknown command %q: did you mean %s %s? (%s %s --help)\n", t.Name, name, t.Name, guess, t.Name, guess)
		}
	}
	return fmt.Sprintf("%s: unknown command %q\n%s", t.Name, name, t.Usage)
}

// IsHelp reports whether args ask for help.
func IsHelp(args []string) bool {
	for _, a := range args {
		if a == "-h" || a == "-help" || a == "--help" || a == "help" {
			return true
		}
	}
	return false
}

// Dollars prints micro-dollars as dollars.
func Dollars(micros int64) string { return fmt.Sprintf("%.6f", float64(micros)/1e6) }

// RowCounts prints rows per table, those with rows only, by table name.
func RowCounts(m map[string]int) string {
	var parts []string
	for t, n := range m {
		if n > 0 {
			parts = append(parts, fmt.Sprintf("%s %d", t, n))
		}
	}
	slices.Sort(parts)
	if len(parts) == 0 {
		return "nothing"
	}
	return strings.Join(parts, ", ")
}
