// Package layering holds the test of gputopo's import rules: the layers
// docs/design.md names, as go list sees them.
package layering
