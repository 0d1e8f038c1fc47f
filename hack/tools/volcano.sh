#!/usr/bin/env bash
# Builds the Volcano scheduler (volcano.sh) for make bench-peers: its
# scheduler (vc-scheduler) and its controller manager
# (vc-controller-manager: the PodGroup controller, which makes the
# PodGroup of pods that name no group, and the queue controller, which
# opens the queues the scheduler allocates from), into bin/vc-scheduler
# and bin/vc-controller-manager. The webhook manager is left out: it only
# validates and defaults objects, and the bench writes valid ones.
#
# Volcano is not on the Go module proxy: the source is VOLCANO_SRC (a
# directory) when set, else a clone of github.com/volcano-sh/volcano at
# the pinned commit in _out/src/volcano. It builds inside that tree, so
# that Volcano's own go.mod (Kubernetes 1.36 libraries, its apis module
# replaced by staging/src/volcano.sh/apis) holds. A stamp file records the
# hash of the pin, this script and the source's go.mod and go.sum, so a
# second run returns at once. Not part of make tools: only the peers bench
# runs it.
set -euo pipefail

# master of 2026-08-20, the commit the bench's configuration was read from.
VOLCANO_COMMIT=ed72c7c815a9fd547a787134676f73d42e9d049c
VOLCANO_REPO=${VOLCANO_REPO:-https://github.com/volcano-sh/volcano}

here=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
root=$(cd "$here/../.." && pwd)
bin="${BIN_DIR:-$root/bin}"
mkdir -p "$bin"

# shellcheck source=peer-source.sh
. "$here/peer-source.sh"
src=$(peer_source volcano VOLCANO_SRC "$VOLCANO_REPO" "$VOLCANO_COMMIT" volcano.sh/volcano)

stamp="$bin/.volcano-stamp"
want=$( { echo "$VOLCANO_COMMIT"; cat "$here/volcano.sh" "$src/go.mod" "$src/go.sum"; } | sha256sum | cut -d' ' -f1)
if [ -x "$bin/vc-scheduler" ] && [ -x "$bin/vc-controller-manager" ] &&
  [ -f "$stamp" ] && [ "$(cat "$stamp")" = "$want" ]; then
  echo "volcano: up to date in $bin"
  exit 0
fi

cd "$src"
echo "volcano: building Volcano ${VOLCANO_COMMIT:0:12} from $src into $bin"
start=$(date +%s)
# The version stamp Volcano's Makefile.def gives its binaries (--version).
ldflags="-s -w -X volcano.sh/volcano/pkg/version.GitSHA=$VOLCANO_COMMIT -X volcano.sh/volcano/pkg/version.Version=${VOLCANO_COMMIT:0:12}"
for c in scheduler controller-manager; do
  GOWORK=off GOFLAGS= CGO_ENABLED=0 go build -trimpath -ldflags "$ldflags" -o "$bin/vc-$c" "./cmd/$c"
done
echo "volcano: built in $(( $(date +%s) - start ))s"
echo "$want" > "$stamp"
