//go:build race

package main

// raceEnabled reports whether the tests run under the race detector, as the Go tree's
// internal/race does: the slow tests size their work by it.
const raceEnabled = true
