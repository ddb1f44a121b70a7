package main

import (
	"errors"
	"flag"
	"fmt"
	"io"
	"sort"
	"strconv"
	"strings"
)

// printFlags prints every flag of fs in the --name form the README and the
// help text use (the flag package's own PrintDefaults writes -name; Go's
// flag parsing takes both).
func printFlags(w io.Writer, fs *flag.FlagSet) {
	fs.VisitAll(func(f *flag.Flag) {
		name, usage := flag.UnquoteUsage(f)
		line := "  --" + f.Name
		if name != "" {
			line += " " + name
		}
		fmt.Fprintln(w, line)
		if f.DefValue != "" && f.DefValue != "false" && f.DefValue != "0" && f.DefValue != "0s" {
			def := f.DefValue
			if fmt.Sprintf("%T", f.Value) == "*flag.stringValue" {
				def = strconv.Quote(def)
			}
			usage += " (default " + def + ")"
		}
		fmt.Fprintf(w, "    \t%s\n", strings.ReplaceAll(usage, "\n", "\n    \t"))
	})
}

// flagError rewrites the flag package's "flag provided but not defined:
// -listne" into "unknown flag --listne; did you mean --listen?", with the
// nearest flag as the config file's unknown keys get theirs.
func flagError(fs *flag.FlagSet, err error) error {
	const undefined = "flag provided but not defined: -"
	msg := err.Error()
	if !strings.HasPrefix(msg, undefined) {
		return err
	}
	given := strings.TrimPrefix(msg, undefined)
	var names []string
	fs.VisitAll(func(f *flag.Flag) { names = append(names, f.Name) })
	sort.Strings(names)
	best, bestDist := "", 1<<30
	for _, name := range names {
		if d := editDistance(given, name); d < bestDist {
			best, bestDist = name, d
		}
	}
	if best != "" && bestDist <= max(2, len(given)/3) {
		return fmt.Errorf("unknown flag --%s; did you mean --%s?", given, best)
	}
	return errors.New("unknown flag --" + given)
}
