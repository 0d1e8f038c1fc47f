#!/usr/bin/env bash
# Make sure a Prometheus server is on PATH for the Prometheus telemetry test
# (test/extender, TestPrometheusTelemetrySource): Debian's `prometheus`
# package, installed with apt-get when missing. The test starts its own
# server with its own configuration; the package's service is not used.
set -euo pipefail
if ! command -v prometheus >/dev/null 2>&1; then
	bash "$(dirname "${BASH_SOURCE[0]}")/apt.sh" prometheus
fi
prometheus --version 2>&1 | head -1
