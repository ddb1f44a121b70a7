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

// flagGroup is one heading of a command's help: the flags of one concern,
// and what holds between them.
type flagGroup struct {
	title string
	note  string // requirements between the flags, printed under the title
	flags []string
}

// printFlags prints the flags of fs in the --name form the README and the
// help text use (the flag package's own PrintDefaults writes -name; Go's
// flag parsing takes both): under each group's title in groups' order, or
// in fs's order when groups is nil. A flag of fs in no group is printed
// last, under "Other": TestHelp fails on it.
func printFlags(w io.Writer, fs *flag.FlagSet, groups []flagGroup) {
	if groups == nil {
		fs.VisitAll(func(f *flag.Flag) { printFlag(w, f) })
		return
	}
	seen := map[string]bool{}
	for i, g := range groups {
		if i > 0 {
			fmt.Fprintln(w)
		}
		fmt.Fprintf(w, "%s:\n", g.title)
		if g.note != "" {
			fmt.Fprintf(w, "%s\n", wrap(g.note, "  ", 78))
		}
		for _, name := range g.flags {
			if f := fs.Lookup(name); f != nil && !seen[name] {
				seen[name] = true
				printFlag(w, f)
			}
		}
	}
	var other []*flag.Flag
	fs.VisitAll(func(f *flag.Flag) {
		if !seen[f.Name] {
			other = append(other, f)
		}
	})
	if len(other) > 0 {
		fmt.Fprint(w, "\nOther:\n")
		for _, f := range other {
			printFlag(w, f)
		}
	}
}

func printFlag(w io.Writer, f *flag.Flag) {
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
	fmt.Fprintf(w, "%s\n", wrap(usage, "      ", 78))
}

// wrap breaks text into lines of at most width columns (a longer word
// stays whole), each beginning with indent.
func wrap(text, indent string, width int) string {
	var b strings.Builder
	line := indent
	for _, word := range strings.Fields(text) {
		if line != indent && len(line)+1+len(word) > width {
			b.WriteString(line + "\n")
			line = indent
		}
		if line != indent {
			line += " "
		}
		line += word
	}
	b.WriteString(line)
	return b.String()
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
