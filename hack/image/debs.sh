#!/usr/bin/env bash
# Downloads the Debian packages of the image's base layer into $1 (cached):
# libc6, the glibc gputopo's cgo build links against and go-nvml's dlopen of
# libnvidia-ml.so.1 needs. The version is the build machine's Debian
# candidate, so the image's glibc is the one the binary was linked with.
set -euo pipefail
dir=${1:?usage: debs.sh DIR}
mkdir -p "$dir"
cd "$dir"
if ls libc6_*.deb >/dev/null 2>&1; then
  exit 0
fi
if ! apt-get download libc6 2>/dev/null; then
  apt-get update -qq
  apt-get download libc6
fi
