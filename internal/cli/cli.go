// Package cli holds the command-line conventions idemq's commands share
// (cmd/idemq and the bench module's idemq-bench): --help prints the usage
// to stdout and exits 0, a mistake in the command line is a UsageError
// (exit 2), and --store is checked the same way everywhere.
package cli

import (
	"errors"
	"flag"
	"fmt"
	"io"

	"github.com/idemq/idemq/internal/redact"
)

// ErrHelp is returned by Flags.Parse after --help printed the usage: the
// command exits 0.
var ErrHelp = errors.New("help requested")

// UsageError is a mistake in the command line: the command exits 2.
type UsageError struct{ err error }

// Error returns the mistake's text.
func (u UsageError) Error() string { return u.err.Error() }

// Unwrap returns the mistake.
func (u UsageError) Unwrap() error { return u.err }

// Usagef returns a UsageError with the formatted message.
func Usagef(format string, args ...any) error {
	return UsageError{fmt.Errorf(format, args...)}
}

// Flags is a command's flag set with these conventions.
type Flags struct {
	*flag.FlagSet
	usage  string
	stdout io.Writer
}

// NewFlags returns the flag set of the command called name, whose --help
// prints usage and the flags to stdout.
func NewFlags(name, usage string, stdout io.Writer) *Flags {
	fs := flag.NewFlagSet(name, flag.ContinueOnError)
	fs.SetOutput(io.Discard) // errors are reported once, by the command
	return &Flags{FlagSet: fs, usage: usage, stdout: stdout}
}

// Parse parses args, allowing no positional arguments. It returns ErrHelp
// after printing the usage for --help, and a UsageError for a bad flag.
func (f *Flags) Parse(args []string) error {
	if err := f.FlagSet.Parse(args); err != nil {
		if errors.Is(err, flag.ErrHelp) {
			fmt.Fprint(f.stdout, f.usage+"\nFlags:\n")
			f.SetOutput(f.stdout)
			f.PrintDefaults()
			return ErrHelp
		}
		return UsageError{err}
	}
	if f.NArg() > 0 {
		return Usagef("unexpected argument %q", f.Arg(0))
	}
	return nil
}

// StoreFlag defines --store and returns a function that checks it after
// Parse: required, and a URL with a scheme. Its errors quote nothing of a
// malformed URL, and only the redacted form of one without a scheme.
func (f *Flags) StoreFlag() func() (string, error) {
	s := f.String("store", "", "store URL: postgres://…, mysql://…, sqlite://path (?table= names the dedup table) (required)")
	return func() (string, error) {
		if *s == "" {
			return "", Usagef("--store is required")
		}
		u, err := redact.ParseURL(*s)
		if err != nil {
			// Not quoted: no rule knows where a malformed URL's password ends.
			return "", Usagef("--store: %v", err)
		}
		if u.Scheme == "" {
			return "", Usagef("--store %s is not a URL like postgres://host/db, mysql://host/db or sqlite://path", redact.URL(*s))
		}
		return *s, nil
	}
}
