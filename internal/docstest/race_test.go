//go:build race

package docstest

// raceEnabled is true when the tests run with -race: the README's program
// is then built with -race too, so that it reuses the packages the other
// tests compiled.
const raceEnabled = true
