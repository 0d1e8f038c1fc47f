// Package simulator replays GPU job traces in simulated time through the
// decision core's own filter, score and bind code and through the
// placement policies people run today (count-only first fit, pair-score
// sum, NVIDIA go-gpuallocator's best-effort partition) plus the exhaustive
// per-decision optimum, all on the same trace in one run, so that the
// placement-quality claims in docs/simulator.md can be reproduced and
// checked by anyone.
//
// It is a measuring instrument, a front end of the decision core like
// the extender: no component imports it. It must never import test/
// packages, a test double, a live cluster client or NVML: the core runs
// offline (placement.New, without a Gate) and binds through the simulator's own
// in-memory API (simAPI).
package simulator
