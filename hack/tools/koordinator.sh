#!/usr/bin/env bash
# Builds Koordinator's scheduler (koord-scheduler) for make bench-peers,
# pinned in its own module (koordinator/) whose go.mod carries
# Koordinator's replace lines (Kubernetes 1.28 libraries), into
# bin/koord-scheduler. A stamp file records the hash of the pins, so a
# second run with unchanged pins returns at once; a cold build takes about
# 4 minutes on 2 cores. Not part of make tools: only the peers bench runs it.
set -euo pipefail

here=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
root=$(cd "$here/../.." && pwd)
bin="${BIN_DIR:-$root/bin}"
mkdir -p "$bin"

stamp="$bin/.koordinator-stamp"
want=$(cat "$here/koordinator/go.mod" "$here/koordinator/go.sum" "$here/koordinator.sh" | sha256sum | cut -d' ' -f1)
if [ -x "$bin/koord-scheduler" ] && [ -f "$stamp" ] && [ "$(cat "$stamp")" = "$want" ]; then
  echo "koordinator: up to date in $bin"
  exit 0
fi
cd "$here/koordinator"
kver=$(go list -m -f '{{.Version}}' github.com/koordinator-sh/koordinator)
echo "koordinator: building koord-scheduler $kver into $bin"
start=$(date +%s)
CGO_ENABLED=0 go build -trimpath -ldflags "-s -w" -o "$bin/koord-scheduler" github.com/koordinator-sh/koordinator/cmd/koord-scheduler
echo "koordinator: built in $(( $(date +%s) - start ))s"
echo "$want" > "$stamp"
