#!/usr/bin/env bash
# Make sure the runtime tests' system parts are installed: Debian's runc
# (containerd's OCI runtime; containerd itself is built by `make tools`) and
# containernetworking-plugins (the bridge, host-local and loopback CNI
# plugins in /usr/lib/cni). See test/kubelet's Options.Containerd.
set -euo pipefail
bash "$(dirname "${BASH_SOURCE[0]}")/apt.sh" runc containernetworking-plugins
runc --version | head -1
