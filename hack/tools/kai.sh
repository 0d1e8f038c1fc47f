#!/usr/bin/env bash
# Builds NVIDIA's KAI-Scheduler for make bench-peers: its scheduler, its
# binder (it binds what the scheduler decided, through BindRequest
# objects) and its pod grouper (it makes the PodGroups the scheduler
# schedules), into bin/kai-scheduler, bin/kai-binder and bin/kai-podgrouper.
#
# KAI-Scheduler is not on the Go module proxy: the source is KAI_SRC (a
# directory) when set, else a clone of github.com/NVIDIA/KAI-scheduler at
# the pinned commit in _out/src/kai-scheduler. It builds inside that tree,
# so that KAI's own go.mod (Kubernetes 1.34 libraries) holds. A stamp file
# records the hash of the pin, this script and the source's go.mod and
# go.sum, so a second run returns at once. Not part of make tools: only
# the peers bench runs it.
set -euo pipefail

# main of 2026-03-07, after v0.13.0 (git describe: v0.13.0-rc1-142-g72de64fc),
# the commit the bench's configuration was read from.
KAI_COMMIT=72de64fc8eca10fa8cca26a20156178f3edbe092
KAI_REPO=${KAI_REPO:-https://github.com/NVIDIA/KAI-scheduler}

here=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
root=$(cd "$here/../.." && pwd)
bin="${BIN_DIR:-$root/bin}"
mkdir -p "$bin"

# shellcheck source=peer-source.sh
. "$here/peer-source.sh"
src=$(peer_source kai-scheduler KAI_SRC "$KAI_REPO" "$KAI_COMMIT" github.com/NVIDIA/KAI-scheduler)

stamp="$bin/.kai-stamp"
want=$( { echo "$KAI_COMMIT"; cat "$here/kai.sh" "$src/go.mod" "$src/go.sum"; } | sha256sum | cut -d' ' -f1)
if [ -x "$bin/kai-scheduler" ] && [ -x "$bin/kai-binder" ] && [ -x "$bin/kai-podgrouper" ] &&
  [ -f "$stamp" ] && [ "$(cat "$stamp")" = "$want" ]; then
  echo "kai: up to date in $bin"
  exit 0
fi

cd "$src"
echo "kai: building KAI-Scheduler ${KAI_COMMIT:0:12} from $src into $bin"
start=$(date +%s)
for c in scheduler binder podgrouper; do
  GOWORK=off GOFLAGS= CGO_ENABLED=0 go build -trimpath -ldflags "-s -w" -o "$bin/kai-$c" "./cmd/$c"
done
echo "kai: built in $(( $(date +%s) - start ))s"
echo "$want" > "$stamp"
