//go:build race

package testenv

// RaceEnabled says whether the test binary was built with -race, for the
// few checks whose cost the race detector multiplies without adding to what
// they prove (single-goroutine scans of the whole corpus).
const RaceEnabled = true
