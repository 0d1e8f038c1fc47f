// Package simulator replays GPU job traces in simulated time through the
// extender's own filter, prioritize and bind code and through the
// placement policies people run today (count-only first fit, pair-score
// sum, NVIDIA go-gpuallocator's best-effort partition) plus the exhaustive
// per-decision optimum, all on the same trace in one run, so that the
// placement-quality claims in docs/simulator.md can be reproduced and
// checked by anyone.
//
// It is a measuring instrument, not a component: nothing in webhook,
// extender, nodeagent or topology may import it. It must never import
// test/ packages, a live cluster client or NVML; the extender runs on a
// client-go fake clientset.
package simulator
