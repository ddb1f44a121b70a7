package relay

import (
	"os"
	"testing"

	"github.com/dedupproxy/dedupproxy/internal/testskip"
)

// TestMain runs the tests, then lists those that skipped and why, which a
// plain go test would not show (internal/testskip).
func TestMain(m *testing.M) { os.Exit(testskip.Run(m)) }
