//go:build race

package main

// raceEnabled says the tests run with -race, so the service they start is
// built with it too.
const raceEnabled = true
