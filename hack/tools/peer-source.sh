# Sourced by the peers' build scripts (kai.sh, volcano.sh): the source
# tree of a peer that is not on the Go module proxy.
#
# peer_source NAME VAR REPO COMMIT MODULE prints the tree to build: the
# directory in variable VAR when set (a checkout the user gives), else a
# clone of REPO at COMMIT in _out/src/NAME (kept while it is at COMMIT).
# It fails unless the tree's go.mod is MODULE's.
peer_source() {
  local name=$1 var=$2 repo=$3 commit=$4 module=$5
  local dir=${!var:-}
  local root
  root=$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)
  local src=$dir
  if [ -z "$src" ]; then
    src="$root/_out/src/$name"
    if [ "$(git -C "$src" rev-parse HEAD 2>/dev/null || true)" != "$commit" ]; then
      rm -rf "$src"
      mkdir -p "$(dirname "$src")"
      if ! git clone --quiet --filter=blob:none --no-checkout "$repo" "$src" >&2 ||
        ! git -C "$src" checkout --quiet "$commit" >&2; then
        echo "$name: could not fetch $repo at $commit; set $var to a checkout of it" >&2
        return 1
      fi
    fi
  fi
  if [ ! -f "$src/go.mod" ] || ! grep -q "^module $module\$" "$src/go.mod"; then
    echo "$name: $src is not the source of $module (no go.mod of that module)" >&2
    return 1
  fi
  echo "$src"
}
