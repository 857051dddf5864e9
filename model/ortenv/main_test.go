package ortenv

import (
	"os"
	"testing"

	"github.com/scorer/scorer/internal/testenv"
)

// TestMain creates the one ORT environment, as the scorer does at start:
// TestInitRuntimeErrors checks that a second owner is refused and
// TestProbeRuntime that the probe agrees with the loaded library.
func TestMain(m *testing.M) { os.Exit(testenv.MainWithORT(m, "ortenv", InitRuntime)) }
