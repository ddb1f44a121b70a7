package testskip

import (
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
)

// TestSkipsListedInPlainRun runs go test on a package whose test skips
// (testdata/demo) as a developer or CI does — a package named, no -v —
// and looks for the list in what the go command prints: without it the
// skip would be unseen. Named with -v, and unnamed (streamed), it is
// printed once too.
func TestSkipsListedInPlainRun(t *testing.T) {
	gobin, err := exec.LookPath("go")
	if err != nil {
		t.Fatalf("no go command: %v", err)
	}
	for _, args := range [][]string{
		{"test", "-count=1", "."}, // a package named: a passing package's output is dropped
		{"test", "-count=1"},      // the current directory: streamed
		{"test", "-count=1", "-v", "."},
	} {
		cmd := exec.Command(gobin, args...)
		cmd.Dir = filepath.Join("testdata", "demo")
		out, err := cmd.CombinedOutput()
		if err != nil {
			t.Fatalf("go %s: %v\n%s", strings.Join(args, " "), err, out)
		}
		want := "TestNeedsAThing: the thing is not installed (apt-get install thing)"
		if n := strings.Count(string(out), want); n != 1 {
			t.Errorf("go %s printed the skip list %d times, want once:\n%s", strings.Join(args, " "), n, out)
		}
	}
}

func TestSummary(t *testing.T) {
	skipped.Lock()
	saved := skipped.why
	skipped.why = nil
	skipped.Unlock()
	defer func() {
		skipped.Lock()
		skipped.why = saved
		skipped.Unlock()
	}()
	if s := Summary("p"); s != "" {
		t.Fatalf("nothing skipped, yet %q", s)
	}
	note("TestB", "no kcat\nits output")
	note("TestA", "no kcat")
	note("TestC/x", "opt-in")
	want := "p: 3 skipped (go test -v -run NAME shows each):\n    TestA, TestB: no kcat\n    TestC/x: opt-in\n"
	if s := Summary("p"); s != want {
		t.Fatalf("summary:\n%s\nwant:\n%s", s, want)
	}
}
