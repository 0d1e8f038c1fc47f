#!/usr/bin/env bash
# Builds the workload controllers the ecosystem tests run beside gputopo
# (test/ecosystem), pinned in their own module (controllers/): JobSet's
# controller manager into bin/jobset-controller and LeaderWorkerSet's into
# bin/lws-controller, and Kueue's and the Kubeflow Trainer's, from a
# module of their own (kueue/: they need a newer controller-runtime than
# JobSet's manager compiles against), into bin/kueue and
# bin/trainer-controller-manager (the tests install their CRDs and webhook
# configurations from the same versions' module sources, harness.ModuleDir). A stamp file records the
# hash of the pins, so a second run with unchanged pins returns at once; a
# cold build takes about 5 minutes on 2 cores.
set -euo pipefail

here=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
root=$(cd "$here/../.." && pwd)
bin="${BIN_DIR:-$root/bin}"
mkdir -p "$bin"

stamp="$bin/.controllers-stamp"
want=$(cat "$here/controllers/go.mod" "$here/controllers/go.sum" "$here/kueue/go.mod" "$here/kueue/go.sum" "$here/controllers.sh" | sha256sum | cut -d' ' -f1)
if [ -x "$bin/jobset-controller" ] && [ -x "$bin/lws-controller" ] && [ -x "$bin/kueue" ] && [ -x "$bin/trainer-controller-manager" ] && [ -f "$stamp" ] && [ "$(cat "$stamp")" = "$want" ]; then
  echo "controllers: up to date in $bin"
  exit 0
fi
cd "$here/controllers"
jver=$(go list -m -f '{{.Version}}' sigs.k8s.io/jobset)
lver=$(go list -m -f '{{.Version}}' sigs.k8s.io/lws)
echo "controllers: building JobSet $jver and LeaderWorkerSet $lver into $bin"
start=$(date +%s)
CGO_ENABLED=0 go build -trimpath -ldflags "-s -w" -o "$bin/jobset-controller" sigs.k8s.io/jobset
CGO_ENABLED=0 go build -trimpath -ldflags "-s -w" -o "$bin/lws-controller" sigs.k8s.io/lws/cmd
cd "$here/kueue"
kver=$(go list -m -f '{{.Version}}' sigs.k8s.io/kueue)
echo "controllers: building Kueue $kver into $bin"
CGO_ENABLED=0 go build -trimpath -ldflags "-s -w" -o "$bin/kueue" sigs.k8s.io/kueue/cmd/kueue
tver=$(go list -m -f '{{.Version}}' github.com/kubeflow/trainer/v2)
echo "controllers: building Kubeflow Trainer $tver into $bin"
CGO_ENABLED=0 go build -trimpath -ldflags "-s -w" -o "$bin/trainer-controller-manager" github.com/kubeflow/trainer/v2/cmd/trainer-controller-manager
echo "controllers: built in $(( $(date +%s) - start ))s"
echo "$want" > "$stamp"
