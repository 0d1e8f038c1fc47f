package localcluster

import (
	"fmt"
	"io"
	"net/http"
	"strings"
	"time"

	"github.com/prometheus/common/expfmt"
	"github.com/prometheus/common/model"
)

// LedgerGPUs reads a GPU decision core's /metrics (the extender's, or the
// gputopo-scheduler plugin build's metricsBindAddress) and returns its
// ledger's GPUs by state (gputopo_extender_ledger_gpus: free, held,
// reserved, unhealthy) plus "double_held"
// (gputopo_extender_ledger_double_held_gpus) and "group_reservations"
// (gputopo_extender_group_reservations).
func LedgerGPUs(url string) (map[string]float64, error) {
	hc := &http.Client{Timeout: 5 * time.Second}
	resp, err := hc.Get(url)
	if err != nil {
		return nil, err
	}
	defer resp.Body.Close()
	if resp.StatusCode != http.StatusOK {
		return nil, fmt.Errorf("GET %s: %s", url, resp.Status)
	}
	p := expfmt.NewTextParser(model.UTF8Validation)
	fams, err := p.TextToMetricFamilies(resp.Body)
	if err != nil {
		return nil, fmt.Errorf("parse %s: %w", url, err)
	}
	out := map[string]float64{}
	if f := fams["gputopo_extender_ledger_gpus"]; f != nil {
		for _, m := range f.Metric {
			for _, l := range m.Label {
				if l.GetName() == "state" {
					out[l.GetValue()] = m.GetGauge().GetValue()
				}
			}
		}
	} else {
		return nil, fmt.Errorf("%s has no gputopo_extender_ledger_gpus", url)
	}
	if f := fams["gputopo_extender_ledger_double_held_gpus"]; f != nil && len(f.Metric) > 0 {
		out["double_held"] = f.Metric[0].GetGauge().GetValue()
	}
	if f := fams["gputopo_extender_group_reservations"]; f != nil && len(f.Metric) > 0 {
		out["group_reservations"] = f.Metric[0].GetGauge().GetValue()
	}
	// Nodes by topology state, as nodes_<state> (nodes_untrusted, ...).
	if f := fams["gputopo_extender_topology_nodes"]; f != nil {
		for _, m := range f.Metric {
			for _, l := range m.Label {
				if l.GetName() == "state" {
					out["nodes_"+l.GetValue()] = m.GetGauge().GetValue()
				}
			}
		}
	}
	return out, nil
}

// CoreReady reports whether the decision core serving metrics at addr
// (host:port) decides: its /readyz answers 200 (informers synced, ledger
// rebuilt from the pods). The reason is /readyz's answer otherwise.
func CoreReady(addr string) (bool, string) {
	hc := &http.Client{Timeout: 2 * time.Second}
	resp, err := hc.Get("http://" + addr + "/readyz")
	if err != nil {
		return false, err.Error()
	}
	defer resp.Body.Close()
	b, _ := io.ReadAll(io.LimitReader(resp.Body, 1024))
	return resp.StatusCode == http.StatusOK, strings.TrimSpace(string(b))
}
