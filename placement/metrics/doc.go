// Package metrics is the Prometheus side of a gputopo scheduler: the
// decision core's counts (it implements placement.Observer), the ledger's
// gauges read at scrape time, and the HTTP extender's own (verb latency,
// shadow mode), under the metric names both front ends export
// (docs/extender.md, "Metrics"; five of them also under deprecated
// gpu_extender_* names for one release, deprecated.go). Handler and Serve
// serve them with /readyz.
package metrics
