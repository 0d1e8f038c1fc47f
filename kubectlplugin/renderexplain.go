package kubectlplugin

// The rendering of `kubectl gputopo explain`: a pod, its scheduling
// condition and events, a workload, a group.

import (
	"fmt"
	"io"
	"strconv"
	"strings"
	"time"

	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/util/duration"
)

// writeExplanation prints explain: what decides the pod and what it has
// said so far (scheduler, PodScheduled, events), then the bound pod's
// placement or every node's verdict.
func writeExplanation(w io.Writer, p painter, e *Explanation) error {
	fmt.Fprintf(w, "%s  %s, requests %d GPU(s), wants %s, strategy %s\n", p.c(bold, "Pod "+e.Namespace+"/"+e.Name), e.Phase, e.Requested, e.RequestedTier, e.Strategy)
	if e.Requirement != "" {
		fmt.Fprintf(w, "requirement:  %s\n", e.Requirement)
	}
	if e.Group != nil {
		writeGroup(w, p, e.Group)
	}
	profiles := strings.Join(e.Profiles, ", ")
	if e.GputopoDecides {
		fmt.Fprintf(w, "scheduler:    %s, a gputopo profile: gputopo's filter and scores decide its node and GPUs\n", e.SchedulerName)
	} else {
		fmt.Fprintf(w, "scheduler:    %s\n", p.c(yellow, e.SchedulerName+" is not a gputopo profile ("+profiles+"): gputopo never decides this pod"))
		fmt.Fprintf(w, "              (the webhook routes GPU pods of opted-in namespaces to gputopo; see \"The pod is not gputopo's\" in docs/troubleshooting.md)\n")
	}
	writeScheduled(w, p, e)
	writeEvents(w, p, "events:      ", e.Events, false)
	fmt.Fprintln(w)
	if b := e.Bound; b != nil {
		fmt.Fprintf(w, "bound to node %s\n", b.Node)
		if pl := b.Placement; pl != nil {
			bw := ""
			if len(pl.GPUIndices) > 1 {
				bw = fmt.Sprintf(", ring %d GB/s, min pair %d GB/s", pl.RingBandwidthGBps, pl.MinPairBandwidthGBps)
			}
			fmt.Fprintf(w, "planned:   GPUs %s on node %s, tier %s%s, strategy %s, score %d\n", ints(pl.GPUIndices), pl.Node, p.c(tierColour(string(pl.Tier)), string(pl.Tier)), bw, pl.Strategy, pl.Score)
		}
		if pl := b.Placement; pl != nil && pl.Degraded {
			fmt.Fprintf(w, "fell back: %s\n", p.c(yellow, pl.DegradedReason))
		}
		fmt.Fprintf(w, "assigned:  %s\n", dash(strings.Join(b.Assigned, ",")))
		fmt.Fprintf(w, "allocated: %s\n", dash(strings.Join(b.Allocated, ",")))
		allocator := "kubelet"
		if len(b.Claims) > 0 {
			fmt.Fprintf(w, "claims:    %s (their allocation is the truth)\n", strings.Join(b.Claims, ","))
			allocator = "DRA"
		}
		truth := b.Truth
		switch b.Truth {
		case TruthMatches:
			truth = p.c(green, truth) + ": " + allocator + " allocated the GPUs gputopo planned"
		case TruthDrift:
			truth = p.c(red, truth) + ": " + allocator + " allocated other GPUs than gputopo planned (see docs/troubleshooting.md, Drift)"
		case TruthNotRecorded:
			truth = p.c(yellow, truth) + ": the node agent has not recorded allocated-gpus yet (is the container started, is the agent running?)"
		case TruthNoPlan:
			if len(b.Claims) > 0 {
				truth = p.c(yellow, truth) + ": the pod has no assigned-gpus; its claims' devices were DRA's choice on the node (extender mode, or another scheduler)"
				break
			}
			truth = p.c(yellow, truth) + ": the pod has no assigned-gpus; it was not bound by the gputopo extender"
		}
		fmt.Fprintf(w, "truth:     %s\n", truth)
		if b.AchievedTier != "" {
			met := p.c(green, "meets the requirement")
			if !b.Met {
				met = p.c(red, "does not meet the requirement")
			}
			ring := ""
			if b.AchievedRing > 0 {
				ring = fmt.Sprintf(", ring %d GB/s", b.AchievedRing)
			}
			fmt.Fprintf(w, "achieved:  tier %s%s: %s\n", p.c(tierColour(b.AchievedTier), b.AchievedTier), ring, met)
		}
		return nil
	}
	fits := 0
	for _, v := range e.Nodes {
		if v.Verdict == VerdictFits && v.Scheduler == "" {
			fits++
		}
	}
	switch {
	case !e.GputopoDecides:
		fmt.Fprintf(w, "What gputopo would do, were the pod routed to it (extender configuration: %s): %d node(s) would pass its filter now; %s decides instead\n\n", e.ConfigSource, fits, e.SchedulerName)
	case e.Scheduled != nil && e.Scheduled.Reason == ReasonSchedulerError:
		fmt.Fprintf(w, "gputopo's filter and scores (extender configuration: %s); %d node(s) would take it once the scheduler gets gputopo's answer\n\n", e.ConfigSource, fits)
	default:
		fmt.Fprintf(w, "gputopo's filter and scores (extender configuration: %s); %d node(s) would take it now\n\n", e.ConfigSource, fits)
	}
	t := newTable(w)
	fmt.Fprintln(t, "NODE\tVERDICT\tSCORE\tGPUS\tTIER\tRING GB/S\tKUBE-SCHEDULER\tREASON")
	for _, v := range e.Nodes {
		verdict, score, ring := v.Verdict, "-", "-"
		switch v.Verdict {
		case VerdictFits:
			verdict = p.c(green, verdict)
			score, ring = strconv.FormatInt(v.Score, 10), strconv.Itoa(v.RingBandwidthGBps)
		case VerdictNever:
			verdict = p.c(red, verdict)
		default:
			verdict = p.c(yellow, verdict)
		}
		sched := "ok"
		if v.Scheduler != "" {
			sched = p.c(yellow, v.Scheduler)
		}
		fmt.Fprintf(t, "%s\t%s\t%s\t%s\t%s\t%s\t%s\t%s\n", v.Node, verdict, score, ints(v.GPUs), p.c(tierColour(v.Tier), dash(v.Tier)), ring, sched, dash(v.Reason))
	}
	if err := t.Flush(); err != nil {
		return err
	}
	for _, v := range e.Nodes {
		if len(v.Preempt) > 0 {
			fmt.Fprintf(w, "\nPreemption on %s would evict %d pod(s) of lower priority whose GPUs the pod needs: %s", v.Node, len(v.Preempt), strings.Join(v.Preempt, ", "))
		}
	}
	fmt.Fprintln(w, "\nfits: the node passes gputopo's filter now; fails: not with its GPUs free now; never: not even with every GPU free and healthy.")
	fmt.Fprintln(w, "KUBE-SCHEDULER: what kube-scheduler's own filters say before gputopo is asked (node selector, taints, GPU count).")
	return nil
}

// writeScheduled prints the PodScheduled condition, with what it means for
// a pod gputopo decides.
func writeScheduled(w io.Writer, p painter, e *Explanation) {
	c := e.Scheduled
	if c == nil {
		fmt.Fprintf(w, "PodScheduled: %s\n", p.c(yellow, "not set: no scheduler has tried the pod yet (is a scheduler with the profile "+e.SchedulerName+" running?)"))
		return
	}
	head := c.Status
	if c.Reason != "" {
		head += ", " + c.Reason
	}
	if c.LastTransitionTime != nil {
		head += ", " + duration.HumanDuration(time.Duration(c.AgeSeconds)*time.Second) + " ago"
	}
	colour := green
	if c.Status != string(corev1.ConditionTrue) {
		colour = yellow
		if c.Reason == ReasonSchedulerError {
			colour = red
		}
	}
	line := p.c(colour, head)
	if c.Message != "" {
		line += ": " + c.Message
	}
	fmt.Fprintf(w, "PodScheduled: %s\n", line)
	switch {
	case c.Reason == ReasonSchedulerError && e.GputopoDecides:
		fmt.Fprintln(w, "              the scheduler failed before it could judge the nodes: with a gputopo profile, usually because it")
		fmt.Fprintln(w, "              cannot reach gputopo's extender (see \"The extender is down or not Ready\" in docs/troubleshooting.md)")
	case c.Reason == ReasonUnschedulable && e.GputopoDecides:
		fmt.Fprintln(w, "              no node passed; the verdicts below give each node's reason")
	}
}

// writeEvents prints events as kubectl describe does, oldest first, with
// the object each is about when they are not all about one.
func writeEvents(w io.Writer, p painter, label string, evs Events, withObject bool) {
	switch {
	case evs.Error != "":
		fmt.Fprintf(w, "%s %s\n", label, p.c(yellow, evs.Error))
		return
	case len(evs.Items) == 0:
		fmt.Fprintf(w, "%s none\n", label)
		return
	}
	more := ""
	if evs.Omitted > 0 {
		more = fmt.Sprintf(", %d older not shown", evs.Omitted)
	}
	fmt.Fprintf(w, "%s %d, oldest first%s\n", label, len(evs.Items), more)
	t := newTable(w)
	head := "  TYPE\tREASON\tAGE\tFROM\tOBJECT\tMESSAGE"
	if !withObject {
		head = strings.Replace(head, "\tOBJECT", "", 1)
	}
	fmt.Fprintln(t, head)
	for _, e := range evs.Items {
		typ := e.Type
		if typ == corev1.EventTypeWarning {
			typ = p.c(yellow, typ)
		}
		cols := []string{"  " + typ, e.Reason, eventAge(e), dash(e.From)}
		if withObject {
			cols = append(cols, e.Object)
		}
		cols = append(cols, strings.ReplaceAll(e.Message, "\n", " "))
		fmt.Fprintln(t, strings.Join(cols, "\t"))
	}
	_ = t.Flush()
}

// eventAge is kubectl describe's: "30s", or "30s (x4 over 5m)".
func eventAge(e EventView) string {
	if e.LastSeen == nil {
		return "-"
	}
	last := duration.HumanDuration(time.Duration(e.AgeSeconds) * time.Second)
	if e.Count <= 1 || e.FirstSeen == nil {
		return last
	}
	over := duration.HumanDuration(e.LastSeen.Sub(e.FirstSeen.Time) + time.Duration(e.AgeSeconds)*time.Second)
	return fmt.Sprintf("%s (x%d over %s)", last, e.Count, over)
}

// writeOwnerExplanation prints explain for a workload: its events, the
// refusals among them, and its live pods.
func writeOwnerExplanation(w io.Writer, p painter, o *OwnerExplanation) error {
	kind := o.Kind
	if kind == "" {
		kind = "Workload"
	}
	fmt.Fprintf(w, "%s  its events and live pods (a pod it could not create has no events of its own)\n", p.c(bold, kind+" "+o.Namespace+"/"+o.Name))
	if o.Refused > 0 {
		fmt.Fprintf(w, "refused:      %s\n", p.c(red, fmt.Sprintf("%d pod creation(s) failed (FailedCreate): a pod refused at creation never exists, so no scheduler sees it;", o.Refused)))
		fmt.Fprintln(w, "              the message says what refused it (an admission webhook: \"admission webhook ... denied the request\")")
	}
	writeEvents(w, p, "events:      ", o.Events, true)
	if len(o.Pods) == 0 {
		fmt.Fprintln(w, "pods:         none live")
		return nil
	}
	fmt.Fprintf(w, "pods:         %d live (kubectl gputopo explain -n %s POD for each)\n", len(o.Pods), o.Namespace)
	t := newTable(w)
	fmt.Fprintln(t, "  POD\tPHASE\tNODE\tPODSCHEDULED")
	for _, op := range o.Pods {
		fmt.Fprintf(t, "  %s\t%s\t%s\t%s\n", op.Name, op.Phase, dash(op.Node), dash(op.Scheduled))
	}
	return t.Flush()
}

// writeGroup prints a pod's group: what it asks for, its pods, and where
// it is placed, would be placed now, or why it waits.
func writeGroup(w io.Writer, p painter, g *GroupView) {
	var asks []string
	if g.PodGroup {
		asks = append(asks, "a Kubernetes PodGroup (its size and topology are the PodGroup's, which explain does not read)")
	} else {
		asks = append(asks, fmt.Sprintf("%d pods placed together, all or nothing, in one fabric domain", g.Size))
	}
	if g.Required != "" {
		asks = append(asks, "required "+g.Required)
	}
	if g.Preferred != "" {
		asks = append(asks, "preferred "+g.Preferred)
	}
	if g.SliceSize > 0 {
		asks = append(asks, fmt.Sprintf("in slices of %d pods, each inside one %s domain", g.SliceSize, g.SliceRequired))
	}
	fmt.Fprintf(w, "group:        %s, %s\n", p.c(bold, g.Name), strings.Join(asks, ", "))
	var bound, pending []string
	for _, m := range g.Members {
		if m.Node != "" {
			on := m.Name + " on " + m.Node
			if m.SliceDomain != "" {
				on += fmt.Sprintf(" (slice %d in %s)", m.Slice, m.SliceDomain)
			}
			bound = append(bound, on)
		} else {
			pending = append(pending, m.Name)
		}
	}
	members := fmt.Sprintf("%d bound%s, %d pending%s", len(bound), names(bound), len(pending), names(pending))
	if g.Size > len(g.Members) {
		members += fmt.Sprintf(", %d not created yet", g.Size-len(g.Members))
	}
	fmt.Fprintf(w, "members:      %s\n", members)
	switch {
	case g.Wait != "":
		fmt.Fprintf(w, "waits:        %s\n", p.c(yellow, g.Wait))
		if g.Domain != "" {
			fmt.Fprintf(w, "domain:       %s (its bound pods' placement record)\n", g.Domain)
		}
	case len(g.Nodes) > 0:
		level := ""
		if g.Level != "" {
			level = " (" + g.Level + ")"
		}
		fmt.Fprintf(w, "domain:       %s%s: its %d pod(s) not bound yet go to %s\n", p.c(cyan, g.Domain), level, len(g.Nodes), strings.Join(g.Nodes, ", "))
	case g.Domain != "":
		fmt.Fprintf(w, "domain:       %s (its bound pods' placement record)\n", p.c(cyan, g.Domain))
	}
}

// names lists up to 8 names in parentheses: " (a, b, and 3 more)".
func names(l []string) string {
	if len(l) == 0 {
		return ""
	}
	const most = 8
	if len(l) > most {
		return fmt.Sprintf(" (%s, and %d more)", strings.Join(l[:most], ", "), len(l)-most)
	}
	return " (" + strings.Join(l, ", ") + ")"
}
