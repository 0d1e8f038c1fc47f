package nodeagent

import "fmt"

// applicationXIDs are the XIDs that a user's program causes and that leave
// the GPU fit for the next container: the process gets the error, the GPU
// does not. They are the XIDs NVIDIA's own device plugin skips by default,
// so a cluster moving to gputopo keeps the same health semantics.
var applicationXIDs = map[uint64]string{
	13:  "graphics engine exception",
	31:  "GPU memory page fault",
	43:  "GPU stopped processing",
	45:  "preemptive cleanup, due to previous errors",
	68:  "NVDEC0 exception",
	109: "context switch timeout",
}

// knownCriticalXIDs name the critical XIDs seen most in practice, for the
// health reason a person reads. Any XID that is not an application XID is
// critical, named or not.
var knownCriticalXIDs = map[uint64]string{
	48:  "double bit ECC error",
	61:  "internal micro-controller breakpoint/warning",
	62:  "internal micro-controller halt",
	63:  "ECC page retirement or row remapping recording event",
	64:  "ECC page retirement or row remapper recording failure",
	74:  "NVLink error",
	79:  "GPU has fallen off the bus",
	92:  "high single-bit ECC error rate",
	94:  "contained ECC error",
	95:  "uncontained ECC error",
	119: "GSP RPC timeout",
	120: "GSP error",
	140: "ECC unrecovered error",
}

// XIDClass says what an XID means for the GPU's health.
type XIDClass string

const (
	// XIDApplication: caused by the application; the GPU stays Healthy.
	XIDApplication XIDClass = "application"
	// XIDCritical: the GPU is Unhealthy until the node is serviced.
	XIDCritical XIDClass = "critical"
)

// ClassifyXID tells critical XIDs from application ones and returns the
// health reason written to NodeGPUTopology, e.g. "XID 79: GPU has fallen off
// the bus".
func ClassifyXID(xid uint64) (XIDClass, string) {
	if d, ok := applicationXIDs[xid]; ok {
		return XIDApplication, fmt.Sprintf("XID %d: %s", xid, d)
	}
	if d, ok := knownCriticalXIDs[xid]; ok {
		return XIDCritical, fmt.Sprintf("XID %d: %s", xid, d)
	}
	return XIDCritical, fmt.Sprintf("XID %d: critical error", xid)
}
