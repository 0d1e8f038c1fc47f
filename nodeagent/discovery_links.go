package nodeagent

import (
	"errors"
	"fmt"
	"slices"
	"sort"
	"strings"

	"github.com/gputopo/gputopo/topology/machine"

	"github.com/NVIDIA/go-nvml/pkg/nvml"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"github.com/gputopo/gputopo/api/v1alpha1"
	"github.com/gputopo/gputopo/nodeagent/internal/nvmllevel"
)

// issue is one inconsistency in NVML's answers: a Reason* of
// ConditionTopologyConsistent and what exactly disagreed.
type issue struct {
	reason string
	msg    string
}

// issueOrder ranks the reasons of ConditionTopologyConsistent: the first
// found in this order names the condition.
var issueOrder = []string{v1alpha1.ReasonDuplicateBusID, v1alpha1.ReasonUnknownRemoteBusID, v1alpha1.ReasonAsymmetricLink}

// maxIssuesInMessage bounds the condition's message: a 64-GPU node could
// list thousands of pairs.
const maxIssuesInMessage = 16

// RefusedError is a topology read that was refused because NVML's answers
// contradict each other in a way no conservative value resolves (two GPUs
// with one PCI bus ID). The publisher publishes the node as stale with
// Condition set.
type RefusedError struct {
	Condition metav1.Condition
}

func (e *RefusedError) Error() string {
	return "nvml topology refused: " + e.Condition.Message
}

// consistentCondition is TopologyConsistent when NVML's answers agree.
func consistentCondition() metav1.Condition {
	return metav1.Condition{Type: v1alpha1.ConditionTopologyConsistent, Status: metav1.ConditionTrue, Reason: v1alpha1.ReasonConsistent,
		Message: "both ends of every link agree and every NVLink leads to a GPU or an NVSwitch of this node"}
}

// consistency turns the issues of one read into the TopologyConsistent
// condition (without lastTransitionTime; the publisher sets it) and counts
// them in the inconsistencies metric.
func (s *NVMLSource) consistency(issues []issue) metav1.Condition {
	if len(issues) == 0 {
		s.lastIssues = ""
		return consistentCondition()
	}
	rank := func(reason string) int { return slices.Index(issueOrder, reason) }
	sort.SliceStable(issues, func(i, j int) bool { return rank(issues[i].reason) < rank(issues[j].reason) })
	var b strings.Builder
	for i, is := range issues {
		s.metrics.inconsistency(is.reason)
		if i == maxIssuesInMessage {
			fmt.Fprintf(&b, "; and %d more", len(issues)-i)
			break
		}
		if i > 0 {
			b.WriteString("; ")
		}
		b.WriteString(is.reason + ": " + is.msg)
	}
	c := metav1.Condition{Type: v1alpha1.ConditionTopologyConsistent, Status: metav1.ConditionFalse, Reason: issues[0].reason, Message: b.String()}
	if c.Message != s.lastIssues {
		s.lastIssues = c.Message
		s.logger.Info("NVML answers disagree; publishing the conservative topology", "reason", c.Reason, "issues", len(issues), "detail", c.Message)
	}
	return c
}

// indexByBus maps each GPU's bus key to its index. Two GPUs with one bus
// ID are an issue each: NVLinks name their remote end by bus ID, so such a
// node's links cannot be told apart. GPUs whose bus ID is unknown are left
// out (no NVLink can name them).
func indexByBus(infos []*deviceInfo) (map[string]int, []issue) {
	byBus := make(map[string]int, len(infos))
	var dups []issue
	for i, info := range infos {
		if info.busKey == "" {
			continue
		}
		if j, dup := byBus[info.busKey]; dup {
			dups = append(dups, issue{v1alpha1.ReasonDuplicateBusID, fmt.Sprintf("GPU %d and GPU %d both report PCI bus ID %s; NVLinks cannot be told apart, so the topology is not published",
				j, i, info.gpu.PCIBusID)})
			continue
		}
		byBus[info.busKey] = i
	}
	return byBus, dups
}

// remoteTypeName names an NVLink remote device type for messages.
func remoteTypeName(e linkEnd) string {
	if !e.kindKnown {
		return "not reported by the driver"
	}
	switch e.kind {
	case nvml.NVLINK_DEVICE_TYPE_GPU:
		return "GPU"
	case nvml.NVLINK_DEVICE_TYPE_IBMNPU:
		return "IBM NPU"
	case nvml.NVLINK_DEVICE_TYPE_SWITCH:
		return "NVSwitch"
	}
	return fmt.Sprintf("unknown (%#x)", uint32(e.kind))
}

// resolve sorts one GPU's NVLinks by what NVML says is on the other end:
//
//   - NVSwitch (NVLINK_DEVICE_TYPE_SWITCH): a link into the fabric. Only
//     this answer makes an NVSwitch path; the bus ID is not consulted.
//   - IBM NPU (NVLINK_DEVICE_TYPE_IBMNPU): a link to an IBM POWER CPU, not
//     between GPUs; not counted, and not an inconsistency.
//   - GPU, unknown (0xFF) or not reported: a direct link to the GPU whose
//     bus ID the link names. A bus ID that is no other GPU of this node is
//     an issue and the link is not counted: nothing says what is there.
func resolve(info *deviceInfo, byBus map[string]int) []issue {
	info.toGPU = map[int]int{}
	type unknownRemote struct {
		bus, kind string
	}
	unknown := map[unknownRemote][]int{}
	var order []unknownRemote
	for _, e := range info.ends {
		if e.kindKnown {
			switch e.kind {
			case nvml.NVLINK_DEVICE_TYPE_SWITCH:
				info.switchLinks++
				continue
			case nvml.NVLINK_DEVICE_TYPE_IBMNPU:
				continue
			}
		}
		if j, ok := byBus[busKey(e.remoteBus)]; ok && e.remoteBus != "" && j != info.gpu.Index {
			info.toGPU[j]++
			continue
		}
		k := unknownRemote{e.remoteBus, remoteTypeName(e)}
		if _, seen := unknown[k]; !seen {
			order = append(order, k)
		}
		unknown[k] = append(unknown[k], e.link)
	}
	var issues []issue
	for _, k := range order {
		bus := k.bus
		if bus == "" {
			bus = "unknown"
		}
		issues = append(issues, issue{v1alpha1.ReasonUnknownRemoteBusID, fmt.Sprintf(
			"GPU %d NVLinks %v lead to bus ID %s (remote type %s), which is no other GPU of this node; not counted (an NVSwitch is believed only when NVML reports the remote type NVSwitch)",
			info.gpu.Index, unknown[k], bus, k.kind)})
	}
	return issues
}

// pairEnd is what one GPU of a pair says about the other.
type pairEnd struct {
	level      v1alpha1.PCIeLevel // CrossSocket when the driver would not say
	levelKnown bool
	p2p        nvml.GpuP2PStatus
	p2pKnown   bool
}

// readEnd asks GPU a about GPU b. Only a lost GPU is an error.
func (s *NVMLSource) readEnd(a, b *deviceInfo) (pairEnd, error) {
	e := pairEnd{level: v1alpha1.PCIeCrossSocket}
	level, ret := a.dev.GetTopologyCommonAncestor(b.dev)
	if ok, err := s.check("GetTopologyCommonAncestor", ret); ok {
		e.level, e.levelKnown = nvmllevel.API(level), true
	} else if errors.Is(err, errGPULost) {
		return e, err
	}
	p2p, ret := a.dev.GetP2PStatus(b.dev, nvml.P2P_CAPS_INDEX_READ)
	if ok, err := s.check("GetP2PStatus", ret); ok {
		e.p2p, e.p2pKnown = p2p, true
	} else if errors.Is(err, errGPULost) {
		return e, err
	}
	return e, nil
}

// readLink describes the pair a<b from both ends: NVLink count and whether
// it goes through an NVSwitch, the PCIe common ancestor, P2P support and
// the bandwidth. Where the ends disagree it takes the conservative value:
// fewer NVLinks, the slower per-link speed, the farther PCIe level, P2P
// unsupported; each disagreement is an issue. An end the driver cannot
// answer for counts as the documented default (CrossSocket; P2P from the
// other end) without being an issue. For a lost GPU the last-known link is
// kept.
func (s *NVMLSource) readLink(a, b *deviceInfo) (v1alpha1.Link, []issue, error) {
	ia, ib := a.gpu.Index, b.gpu.Index
	if a.lost || b.lost {
		if l, ok := s.lastLinks[[2]int{ia, ib}]; ok {
			return l, nil, nil
		}
		return v1alpha1.Link{}, nil, fmt.Errorf("gpu %d-gpu %d: no last-known link for a lost GPU: %w", ia, ib, errGPULost)
	}
	var issues []issue
	asym := func(format string, args ...any) {
		issues = append(issues, issue{v1alpha1.ReasonAsymmetricLink, fmt.Sprintf(format, args...)})
	}
	ab, err := s.readEnd(a, b)
	if err != nil {
		return v1alpha1.Link{}, nil, fmt.Errorf("gpu %d-gpu %d: %w", ia, ib, err)
	}
	ba, err := s.readEnd(b, a)
	if err != nil {
		return v1alpha1.Link{}, nil, fmt.Errorf("gpu %d-gpu %d: %w", ib, ia, err)
	}
	l := v1alpha1.Link{A: ia, B: ib, PCIe: ab.level}
	if pcieRank(ba.level) > pcieRank(ab.level) {
		l.PCIe = ba.level
	}
	if ab.levelKnown && ba.levelKnown && ab.level != ba.level {
		asym("GPU %d sees GPU %d at PCIe level %s, GPU %d sees GPU %d at %s; publishing %s", ia, ib, ab.level, ib, ia, ba.level, l.PCIe)
	}

	nab, nba := a.toGPU[ib], b.toGPU[ia]
	l.NVLinks = min(nab, nba)
	if nab != nba {
		asym("GPU %d reports %d NVLinks to GPU %d, GPU %d reports %d to GPU %d; publishing %d", ia, nab, ib, ib, nba, ia, l.NVLinks)
	}
	if l.NVLinks == 0 && a.switchLinks > 0 && b.switchLinks > 0 {
		l.NVLinks, l.NVSwitch = min(a.switchLinks, b.switchLinks), true
	}

	okA := ab.p2pKnown && ab.p2p == nvml.P2P_STATUS_OK
	okB := ba.p2pKnown && ba.p2p == nvml.P2P_STATUS_OK
	switch {
	case ab.p2pKnown && ba.p2pKnown:
		l.P2P = okA && okB
		if okA != okB {
			asym("GPU %d reports P2P reads to GPU %d as %s, GPU %d to GPU %d as %s; publishing P2P unsupported", ia, ib, p2pName(ab.p2p), ib, ia, p2pName(ba.p2p))
		}
	case ab.p2pKnown || ba.p2pKnown:
		l.P2P = okA || okB
	default:
		// Neither end answers: NVLinked pairs do P2P over NVLink.
		l.P2P = l.NVLinks > 0
	}

	if l.NVLinks > 0 {
		if a.linkGBps > 0 && b.linkGBps > 0 && a.linkGBps != b.linkGBps {
			asym("GPU %d reads %d GB/s per NVLink, GPU %d reads %d; publishing %d", ia, a.linkGBps, ib, b.linkGBps, min(a.linkGBps, b.linkGBps))
		}
		l.BandwidthGBps = l.NVLinks * min(nonZero(a.linkGBps), nonZero(b.linkGBps))
	} else {
		l.BandwidthGBps = machine.PCIeBandwidthGBps(min(nonZeroGen(a.pcieGen), nonZeroGen(b.pcieGen)), l.PCIe)
	}
	return l, issues, nil
}

// pcieRank orders PCIe levels from nearest (0) to farthest; CrossSocket
// (and anything else) is the farthest.
func pcieRank(l v1alpha1.PCIeLevel) int { return nvmllevel.Rank(l) }

// p2pName names a P2P status for messages.
func p2pName(st nvml.GpuP2PStatus) string {
	switch st {
	case nvml.P2P_STATUS_OK:
		return "OK"
	case nvml.P2P_STATUS_CHIPSET_NOT_SUPPORTED:
		return "chipset not supported"
	case nvml.P2P_STATUS_GPU_NOT_SUPPORTED:
		return "GPU not supported"
	case nvml.P2P_STATUS_IOH_TOPOLOGY_NOT_SUPPORTED:
		return "IOH topology not supported"
	case nvml.P2P_STATUS_DISABLED_BY_REGKEY:
		return "disabled by regkey"
	case nvml.P2P_STATUS_NOT_SUPPORTED:
		return "not supported"
	}
	return fmt.Sprintf("status %d", uint32(st))
}
