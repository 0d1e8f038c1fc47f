#!/usr/bin/env bash
# Builds the control-plane and code-generation binaries pinned in go.mod, and
# containerd and CoreDNS pinned in their own modules (containerd/, coredns/),
# into bin/ at the repository root. A stamp file records the hash of the pins, so a
# second run with unchanged pins returns at once. A cold build compiles
# Kubernetes and takes about 15 minutes on 2 cores.
set -euo pipefail

here=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
root=$(cd "$here/../.." && pwd)
bin="${BIN_DIR:-$root/bin}"
mkdir -p "$bin"

tools=(kube-apiserver kube-scheduler kube-controller-manager kubelet kube-proxy etcd controller-gen helm containerd containerd-shim-runc-v2 ctr coredns)
pkgs=(
  k8s.io/kubernetes/cmd/kube-apiserver
  k8s.io/kubernetes/cmd/kube-scheduler
  k8s.io/kubernetes/cmd/kube-controller-manager
  k8s.io/kubernetes/cmd/kubelet
  k8s.io/kubernetes/cmd/kube-proxy
  ./etcd
  sigs.k8s.io/controller-tools/cmd/controller-gen
  helm.sh/helm/v3/cmd/helm
)

stamp="$bin/.tools-stamp"
want=$(cat "$here/go.mod" "$here/go.sum" "$here/build.sh" "$here/etcd/main.go" "$here/containerd/go.mod" "$here/containerd/go.sum" "$here/coredns/go.mod" "$here/coredns/go.sum" "$here/coredns/main.go" | sha256sum | cut -d' ' -f1)

complete=true
for t in "${tools[@]}"; do [ -x "$bin/$t" ] || complete=false; done
if $complete && [ -f "$stamp" ] && [ "$(cat "$stamp")" = "$want" ]; then
  echo "tools: up to date in $bin"
  exit 0
fi

kver=$(cd "$here" && go list -m -f '{{.Version}}' k8s.io/kubernetes)
kminor=$(echo "$kver" | cut -d. -f2)
ldflags="-s -w -X k8s.io/component-base/version.gitVersion=$kver -X k8s.io/component-base/version.gitMajor=1 -X k8s.io/component-base/version.gitMinor=$kminor -X k8s.io/component-base/version.gitTreeState=clean"

echo "tools: building ${tools[*]} (Kubernetes $kver) into $bin"
echo "tools: a cold build compiles Kubernetes and takes about 15 minutes on 2 cores; later runs reuse bin/"
start=$(date +%s)
cd "$here"
# One go build for all packages: shared dependencies compile once.
CGO_ENABLED=0 go build -trimpath -ldflags "$ldflags" -o "$bin/" "${pkgs[@]}" &
pid=$!
while kill -0 "$pid" 2>/dev/null; do
  sleep 30
  kill -0 "$pid" 2>/dev/null && echo "tools: still building ($(( $(date +%s) - start ))s elapsed)"
done
wait "$pid"
# containerd, its runc shim and ctr (the runtime tests' container runtime,
# under a real kubelet), from their own module so that their dependency
# versions never move Kubernetes'. No cgo: the btrfs, devmapper and zfs
# snapshotters are left out (overlayfs and native remain).
cver=$(cd "$here/containerd" && go list -m -f '{{.Version}}' github.com/containerd/containerd/v2)
echo "tools: building containerd $cver"
(cd "$here/containerd" && CGO_ENABLED=0 go build -trimpath -tags "no_btrfs no_devmapper no_zfs" \
  -ldflags "-s -w -X github.com/containerd/containerd/v2/version.Version=$cver" -o "$bin/" \
  github.com/containerd/containerd/v2/cmd/containerd \
  github.com/containerd/containerd/v2/cmd/containerd-shim-runc-v2 \
  github.com/containerd/containerd/v2/cmd/ctr)
# CoreDNS with the kubernetes plugin: the cluster DNS of the install tests'
# one-node cluster (hack/tools/coredns names the plugins).
echo "tools: building coredns $(cd "$here/coredns" && go list -m -f '{{.Version}}' github.com/coredns/coredns)"
(cd "$here/coredns" && CGO_ENABLED=0 go build -trimpath -ldflags "-s -w" -o "$bin/coredns" .)
echo "$want" > "$stamp"
echo "tools: done in $(( $(date +%s) - start ))s"
