// Package integration holds tests that need a real control plane but no
// gputopo component: the harness's own smoke test.
package integration
