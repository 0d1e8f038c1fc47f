//go:build tools

// Package kueue pins Kueue's controller manager, which the ecosystem tests
// run (test/ecosystem), in a module of its own: Kueue v0.17.0 is built
// against controller-runtime v0.23, whose webhook builder JobSet v0.11.1's
// manager (hack/tools/controllers) does not compile against, so the two
// cannot share one module. hack/tools/controllers.sh builds it.
package kueue

import _ "sigs.k8s.io/kueue/cmd/kueue"
