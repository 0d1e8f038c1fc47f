//go:build tools

// Package kueue pins Kueue's controller manager and the Kubeflow Trainer
// controller manager, which the ecosystem tests run (test/ecosystem), in
// a module of their own: Kueue v0.17.0 is built against controller-runtime
// v0.23, whose webhook builder JobSet v0.11.1's manager
// (hack/tools/controllers) does not compile against, so the two cannot
// share one module; Kueue v0.17.0 requires Trainer v2.2.0 (its TrainJob
// integration), the version the tests run. hack/tools/controllers.sh
// builds them.
package kueue

import (
	_ "github.com/kubeflow/trainer/v2/cmd/trainer-controller-manager"
	_ "sigs.k8s.io/kueue/cmd/kueue"
)
