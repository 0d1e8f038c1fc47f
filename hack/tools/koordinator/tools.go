//go:build tools

// Package tools pins Koordinator's scheduler (koord-scheduler) at the
// version make bench-peers measures, with Koordinator's own replace
// lines (Kubernetes 1.28 libraries) copied from its go.mod, which a
// dependency's replace lines do not carry.
package tools

import _ "github.com/koordinator-sh/koordinator/cmd/koord-scheduler"
