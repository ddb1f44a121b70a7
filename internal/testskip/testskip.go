// Package testskip lists, when a package's tests end, every test they
// skipped and why. go test shows the output of a package whose tests pass
// only with -v (or -json), so a skip — a client not installed, a fault a
// real cluster cannot inject, an opt-in test — would go unseen in a plain
// `go test ./...`: a green run that did not run everything.
//
// Tests skip with Skip or Skipf instead of t.Skip and t.Skipf, and the
// package's TestMain ends with os.Exit(testskip.Run(m)). Run prints the
// list to the test binary's standard output, which -v and -json show;
// when the tests pass without -v it also writes it to the standard output
// of the go command that runs the binary (Linux: /proc/PPID/fd/1), which
// is what the person or the CI log running `go test ./...` sees, just
// before the package's "ok" line. A result go test took from its cache
// prints nothing: -count=1 runs the tests again. Nothing here is for
// production.
//
// It lives under internal/ because every package whose tests skip uses it.
package testskip

import (
	"flag"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"runtime"
	"sort"
	"strings"
	"sync"
	"testing"
)

var skipped struct {
	sync.Mutex
	why map[string][]string // reason -> the tests skipped for it
}

// Skipf skips t as t.Skipf does and notes it, with its reason, for Run's
// list.
func Skipf(t testing.TB, format string, args ...any) {
	t.Helper()
	note(t.Name(), fmt.Sprintf(format, args...))
	t.Skipf(format, args...)
}

// Skip skips t as t.Skip does and notes it, with its reason, for Run's
// list.
func Skip(t testing.TB, args ...any) {
	t.Helper()
	note(t.Name(), fmt.Sprint(args...))
	t.Skip(args...)
}

func note(test, reason string) {
	reason, _, _ = strings.Cut(strings.TrimSpace(reason), "\n") // the first line says why
	skipped.Lock()
	defer skipped.Unlock()
	if skipped.why == nil {
		skipped.why = map[string][]string{}
	}
	skipped.why[reason] = append(skipped.why[reason], test)
}

// Run runs the package's tests and lists those Skip and Skipf skipped (see
// the package comment); it returns m.Run's exit code.
func Run(m *testing.M) int {
	code := m.Run()
	list := Summary(packageName())
	if list == "" {
		return code
	}
	fmt.Print(list)
	if code == 0 && !verbose() {
		// Passing without -v, go test drops what the binary printed.
		if w := goCommandStdout(); w != nil {
			fmt.Fprint(w, list)
			w.Close()
		}
	}
	return code
}

// Summary is the list of the tests skipped so far, one line per reason,
// headed by pkg; "" when none was.
func Summary(pkg string) string {
	skipped.Lock()
	defer skipped.Unlock()
	if len(skipped.why) == 0 {
		return ""
	}
	reasons := make([]string, 0, len(skipped.why))
	n := 0
	for r, tests := range skipped.why {
		reasons = append(reasons, r)
		n += len(tests)
	}
	sort.Strings(reasons)
	var b strings.Builder
	fmt.Fprintf(&b, "%s: %d skipped (go test -v -run NAME shows each):\n", pkg, n)
	for _, r := range reasons {
		tests := append([]string(nil), skipped.why[r]...)
		sort.Strings(tests)
		fmt.Fprintf(&b, "    %s: %s\n", strings.Join(tests, ", "), r)
	}
	return b.String()
}

// packageName is the test binary's package: its name without ".test".
func packageName() string {
	return strings.TrimSuffix(filepath.Base(os.Args[0]), ".test")
}

// verbose reports whether go test runs the binary with -v or -json
// (-test.v=test2json), which show what it prints.
func verbose() bool {
	f := flag.Lookup("test.v")
	return f != nil && f.Value.String() != "false"
}

// goCommandStdout opens, for appending, the standard output of the go
// command that runs this test binary, or returns nil: not Linux, not run
// by the go command (by hand, or under go test -exec), or the same file
// as the binary's own (go test with no package named streams the output).
func goCommandStdout() io.WriteCloser {
	if runtime.GOOS != "linux" {
		return nil
	}
	ppid := os.Getppid()
	exe, err := os.Readlink(fmt.Sprintf("/proc/%d/exe", ppid))
	if err != nil || strings.TrimSuffix(filepath.Base(exe), ".exe") != "go" {
		return nil
	}
	path := fmt.Sprintf("/proc/%d/fd/1", ppid)
	theirs, err := os.Stat(path)
	if err != nil {
		return nil
	}
	if ours, err := os.Stdout.Stat(); err == nil && os.SameFile(ours, theirs) {
		return nil
	}
	f, err := os.OpenFile(path, os.O_WRONLY|os.O_APPEND, 0)
	if err != nil {
		return nil
	}
	return f
}
