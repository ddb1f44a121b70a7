package main

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"io"
	"strings"
)

// subcommandNames lists the subcommands: cluster, demo, audit, version, help.
func subcommandNames() string {
	names := make([]string, len(subcommands))
	for i, sc := range subcommands {
		names[i] = sc.name
	}
	return strings.Join(names, ", ")
}

// runHelp is dedupproxy help [subcommand]: the command's help, or a
// subcommand's, as --help prints it.
func runHelp(args []string, stdout, stderr io.Writer) int {
	if len(args) == 0 || len(args) == 1 && (args[0] == "help" || isHelpFlag(args[0])) {
		newFlags().usage(stdout)
		return 0
	}
	if len(args) == 1 {
		for _, sc := range subcommands {
			if sc.name == args[0] && sc.usage != nil {
				sc.usage(stdout)
				return 0
			}
		}
	}
	return usageError(stderr, "dedupproxy help", fmt.Errorf("no subcommand %q (subcommands: %s)", strings.Join(args, " "), subcommandNames()))
}

func isHelpFlag(a string) bool {
	switch a {
	case "-h", "--h", "-help", "--help":
		return true
	}
	return false
}

// noFlags parses args of a subcommand that takes no flags: --help (or
// -h) prints its help, anything else is a mistake (exit 2). It reports
// whether to go on, and otherwise the exit code.
func noFlags(name string, args []string, usage func(io.Writer), stdout, stderr io.Writer) (int, bool) {
	fs := flag.NewFlagSet(name, flag.ContinueOnError)
	fs.SetOutput(io.Discard)
	fs.Usage = func() {}
	switch err := fs.Parse(args); {
	case errors.Is(err, flag.ErrHelp):
		usage(stdout)
		return 0, false
	case err != nil:
		return usageError(stderr, name, flagError(fs, err)), false
	case fs.NArg() > 0:
		return usageError(stderr, name, fmt.Errorf("unexpected argument %q", fs.Arg(0))), false
	}
	return 0, true
}

func demoUsage(w io.Writer) {
	fmt.Fprint(w, `dedupproxy demo: show duplicates prevented, against an embedded cluster.

Usage:
  dedupproxy demo

Starts an in-memory Kafka cluster and the proxy in front of it, inside this
process, and replays three lost acknowledgements, each once straight to the
cluster and once through the proxy: a legacy producer's retry, an idempotent
producer's retry, and a client that reuses a sequence number for new records.
It prints what the cluster stored each time, and exits. No flags.
`)
}

// runDemoCommand is dedupproxy demo.
func runDemoCommand(ctx context.Context, args []string, stdout, stderr io.Writer) int {
	if code, ok := noFlags("dedupproxy demo", args, demoUsage, stdout, stderr); !ok {
		return code
	}
	if err := runDemo(ctx, stdout); err != nil {
		fmt.Fprintln(stderr, "dedupproxy demo:", err)
		return 1
	}
	return 0
}

func versionUsage(w io.Writer) {
	fmt.Fprint(w, `dedupproxy version: print the version and VCS revision.

Usage:
  dedupproxy version

The same as dedupproxy --version; /metrics exports it as
dedupproxy_build_info{version,goversion,revision}. No flags.
`)
}

// runVersion is dedupproxy version.
func runVersion(_ context.Context, args []string, stdout, stderr io.Writer) int {
	if code, ok := noFlags("dedupproxy version", args, versionUsage, stdout, stderr); !ok {
		return code
	}
	fmt.Fprintln(stdout, versionLine())
	return 0
}
