package metrics

import (
	"strings"

	"github.com/prometheus/client_golang/prometheus"
)

// Five metrics were called gpu_extender_* (the design's names:
// scheduling_latency_seconds, filter_results_total, prioritize_scores,
// gpu_utilization_percent, errors_total); they are gputopo_extender_* now,
// like every other metric of the scheduler. For one release each is
// exported under its old name too, as a deprecated duplicate, so that
// dashboards and alerts can move at their own pace; the old names are
// removed in the next minor release.
const (
	renamedTo   = "gputopo_extender_"
	renamedFrom = "gpu_extender_"
)

// withDeprecatedName exports c, the collector of the one metric name
// (help, variable labels), a second time under its deprecated name: the
// same series, read from the same storage at the same scrape, under a
// description whose help starts "Deprecated: use name;". One store, no
// second call site to keep in step.
func withDeprecatedName(c prometheus.Collector, name, help string, labels []string) prometheus.Collector {
	old := renamedFrom + strings.TrimPrefix(name, renamedTo)
	return &deprecatedName{c: c, old: prometheus.NewDesc(old, "Deprecated: use "+name+"; "+help, labels, nil)}
}

// deprecatedName is c, whose every series is sent twice: as c collects it,
// and under old.
type deprecatedName struct {
	c   prometheus.Collector
	old *prometheus.Desc
}

func (d *deprecatedName) Describe(ch chan<- *prometheus.Desc) {
	d.c.Describe(ch)
	ch <- d.old
}

func (d *deprecatedName) Collect(ch chan<- prometheus.Metric) {
	series := make(chan prometheus.Metric)
	go func() {
		d.c.Collect(series)
		close(series)
	}()
	for m := range series {
		ch <- m
		ch <- renamed{Metric: m, desc: d.old}
	}
}

// renamed is a series under another description with the same labels:
// Write is the series' own, so the value is the one the series holds.
type renamed struct {
	prometheus.Metric
	desc *prometheus.Desc
}

func (r renamed) Desc() *prometheus.Desc { return r.desc }
