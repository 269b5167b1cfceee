//go:build !race

package docstest

const raceEnabled = false
