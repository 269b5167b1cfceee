// Package docstest holds the documentation's tests: the README's first Go
// program builds as a user's program, every relative link in README.md and
// docs/*.md resolves, the README stays short and holds the test command CI
// runs. It has no code of its own.
package docstest
