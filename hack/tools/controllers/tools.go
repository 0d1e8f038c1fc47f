//go:build tools

// Package controllers pins the workload controllers the ecosystem tests
// run (test/ecosystem) in their own module, so that their dependency
// versions (JobSet v0.11.1 is built against Kubernetes 0.35, LeaderWorkerSet
// v0.8.0 against 0.34) never move the main module's or Kubernetes'.
// hack/tools/controllers.sh builds them.
package controllers

import (
	_ "sigs.k8s.io/jobset"
	_ "sigs.k8s.io/lws/cmd"
)
