//go:build tools

// Package tools pins the container runtime the runtime tests run under
// kubelet: containerd, its runc shim and ctr. hack/tools/build.sh builds them
// into bin/ with CGO disabled and without the btrfs, devmapper and zfs
// snapshotters, which need C libraries this machine does not have.
package tools

import (
	_ "github.com/containerd/containerd/v2/cmd/containerd"
	_ "github.com/containerd/containerd/v2/cmd/containerd-shim-runc-v2"
	_ "github.com/containerd/containerd/v2/cmd/ctr"
)
