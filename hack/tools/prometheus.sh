#!/usr/bin/env bash
# Make sure a Prometheus server is on PATH for the Prometheus telemetry test
# (test/extender, TestPrometheusTelemetrySource): Debian's `prometheus`
# package, installed with apt-get when missing. The test starts its own
# server with its own configuration; the package's service is not used.
set -euo pipefail
if command -v prometheus >/dev/null 2>&1; then
	prometheus --version 2>&1 | head -1
	exit 0
fi
if ! command -v apt-get >/dev/null 2>&1; then
	echo "prometheus is not installed and apt-get is not available; install a Prometheus server (2.x) and put it on PATH, or set GPUTOPO_PROMETHEUS" >&2
	exit 1
fi
SUDO=""
if [ "$(id -u)" != 0 ]; then
	if ! command -v sudo >/dev/null 2>&1; then
		echo "prometheus is not installed; run as root or install it: apt-get install prometheus" >&2
		exit 1
	fi
	SUDO="sudo"
fi
echo "installing Debian's prometheus package"
$SUDO apt-get update -qq
# policy-rc.d may refuse to start the packaged service (no init here); the
# binary is all the test needs.
DEBIAN_FRONTEND=noninteractive $SUDO apt-get install -y -qq --no-install-recommends prometheus >/dev/null
prometheus --version 2>&1 | head -1
