#!/usr/bin/env bash
# Installs the Debian packages named as arguments that are not installed yet
# (apt-get, as root or through sudo). Used by .ci/run for the test tier's
# system parts: Prometheus (prometheus.sh), runc and the CNI plugins
# (runtime.sh).
set -euo pipefail
missing=()
for p in "$@"; do
	dpkg -s "$p" >/dev/null 2>&1 || missing+=("$p")
done
[ ${#missing[@]} -eq 0 ] && exit 0
if ! command -v apt-get >/dev/null 2>&1; then
	echo "missing packages ${missing[*]} and apt-get is not available: install them by other means" >&2
	exit 1
fi
SUDO=""
if [ "$(id -u)" != 0 ]; then
	if ! command -v sudo >/dev/null 2>&1; then
		echo "missing packages ${missing[*]}: run as root or install them: apt-get install ${missing[*]}" >&2
		exit 1
	fi
	SUDO="sudo"
fi
echo "installing Debian packages: ${missing[*]}"
$SUDO apt-get update -qq
# policy-rc.d may refuse to start packaged services (no init here); the
# binaries are all the tests need.
DEBIAN_FRONTEND=noninteractive $SUDO apt-get install -y -qq --no-install-recommends "${missing[@]}" >/dev/null
