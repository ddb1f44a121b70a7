// Package demo is the package TestSkipsListedInPlainRun runs go test on:
// one test runs, one skips. (Under testdata: ./... leaves it out.)
package demo

import (
	"os"
	"testing"

	"github.com/dedupproxy/dedupproxy/internal/testskip"
)

func TestMain(m *testing.M) { os.Exit(testskip.Run(m)) }

func TestNeedsAThing(t *testing.T) {
	testskip.Skipf(t, "the thing is not installed (%s)", "apt-get install thing")
}

func TestRuns(t *testing.T) {}
