//go:build !race

package testenv

// RaceEnabled says whether the test binary was built with -race (race.go).
const RaceEnabled = false
