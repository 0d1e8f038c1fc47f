package kubectlplugin

import (
	"context"
	"fmt"
	"sort"
	"strings"
	"time"

	batchv1 "k8s.io/api/batch/v1"
	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/fields"
	"k8s.io/apimachinery/pkg/types"
	"sigs.k8s.io/controller-runtime/pkg/client"
)

// MaxEvents is how many of an object's events explain shows, the most
// recent ones.
const MaxEvents = 10

// EventView is one Event as explain shows it.
type EventView struct {
	Type   string `json:"type"`
	Reason string `json:"reason"`
	// Object is the event's object as Kind/name.
	Object  string `json:"object"`
	From    string `json:"from,omitempty"`
	Message string `json:"message"`
	// Count is how often it was seen, from FirstSeen to LastSeen.
	Count     int32        `json:"count"`
	FirstSeen *metav1.Time `json:"firstSeen,omitempty"`
	LastSeen  *metav1.Time `json:"lastSeen,omitempty"`
	// AgeSeconds is how long ago it was last seen.
	AgeSeconds int64 `json:"ageSeconds"`
}

// Events are the object's events explain shows: the most recent MaxEvents,
// oldest first, and how many older ones were left out. Error says why
// they could not be read (RBAC: list events in the namespace); explain
// goes on without them.
type Events struct {
	Items   []EventView `json:"items,omitempty"`
	Omitted int         `json:"omitted,omitempty"`
	Error   string      `json:"error,omitempty"`
}

// listEvents lists the namespace's core/v1 Events that match every field
// of sel (exact values), with a field selector, so that the API server
// sends only those.
func listEvents(ctx context.Context, c client.Reader, namespace string, sel fields.Set) ([]corev1.Event, error) {
	var list corev1.EventList
	if err := c.List(ctx, &list, client.InNamespace(namespace), client.MatchingFieldsSelector{Selector: fields.SelectorFromSet(sel)}); err != nil {
		return nil, err
	}
	out := list.Items[:0]
	for _, e := range list.Items {
		ok := true
		for f, v := range sel {
			ok = ok && eventField(&e, f) == v
		}
		if ok {
			out = append(out, e)
		}
	}
	return out, nil
}

// eventFields are the Event fields explain selects on, as kube-apiserver
// names them for field selectors.
const (
	fieldObjectUID  = "involvedObject.uid"
	fieldObjectName = "involvedObject.name"
	fieldObjectKind = "involvedObject.kind"
	fieldReason     = "reason"
)

// eventField reads a field explain selects on, so that what the API server
// selected is checked again here.
func eventField(e *corev1.Event, field string) string {
	switch field {
	case fieldObjectUID:
		return string(e.InvolvedObject.UID)
	case fieldObjectName:
		return e.InvolvedObject.Name
	case fieldObjectKind:
		return e.InvolvedObject.Kind
	case fieldReason:
		return e.Reason
	}
	return ""
}

// eventsError words a failed event read for the output.
func eventsError(namespace string, err error) string {
	if apierrors.IsForbidden(err) {
		return fmt.Sprintf("not readable: your user may not list events in namespace %s (docs/troubleshooting.md lists what the plugin reads)", namespace)
	}
	return fmt.Sprintf("not readable: %v", err)
}

// lastSeen is when an event was last seen: the series' last observation,
// the legacy lastTimestamp, or the event time (events.k8s.io events, which
// kube-scheduler writes, have no lastTimestamp).
func lastSeen(e *corev1.Event) time.Time {
	switch {
	case e.Series != nil && !e.Series.LastObservedTime.IsZero():
		return e.Series.LastObservedTime.Time
	case !e.LastTimestamp.IsZero():
		return e.LastTimestamp.Time
	case !e.EventTime.IsZero():
		return e.EventTime.Time
	}
	return e.CreationTimestamp.Time
}

func firstSeen(e *corev1.Event) time.Time {
	switch {
	case !e.FirstTimestamp.IsZero():
		return e.FirstTimestamp.Time
	case !e.EventTime.IsZero():
		return e.EventTime.Time
	}
	return e.CreationTimestamp.Time
}

func eventCount(e *corev1.Event) int32 {
	switch {
	case e.Series != nil && e.Series.Count > 0:
		return e.Series.Count
	case e.Count > 0:
		return e.Count
	}
	return 1
}

// eventViews turns events into what explain shows: the most recent
// MaxEvents, oldest first.
func eventViews(now time.Time, evs []corev1.Event) Events {
	sort.SliceStable(evs, func(i, j int) bool {
		a, b := lastSeen(&evs[i]), lastSeen(&evs[j])
		if !a.Equal(b) {
			return a.Before(b)
		}
		return evs[i].Name < evs[j].Name
	})
	var out Events
	if len(evs) > MaxEvents {
		out.Omitted = len(evs) - MaxEvents
		evs = evs[len(evs)-MaxEvents:]
	}
	for i := range evs {
		e := &evs[i]
		first, last := metav1.NewTime(firstSeen(e)), metav1.NewTime(lastSeen(e))
		from := e.Source.Component
		if from == "" {
			from = e.ReportingController
		}
		v := EventView{Type: e.Type, Reason: e.Reason, Object: e.InvolvedObject.Kind + "/" + e.InvolvedObject.Name, From: from,
			Message: strings.TrimSpace(e.Message), Count: eventCount(e), FirstSeen: &first, LastSeen: &last}
		if !last.IsZero() {
			v.AgeSeconds = int64(now.Sub(last.Time) / time.Second)
		}
		out.Items = append(out.Items, v)
	}
	return out
}

// podEvents reads the pod's events: by the pod's UID and name, so that an
// earlier pod of the same name does not show.
func podEvents(ctx context.Context, c client.Reader, now time.Time, p *corev1.Pod) Events {
	return objectEvents(ctx, c, now, p.Namespace, fields.Set{fieldObjectName: p.Name}, p.UID)
}

// objectEvents reads the events that match sel and, when uid is known,
// the object's UID.
func objectEvents(ctx context.Context, c client.Reader, now time.Time, namespace string, sel fields.Set, uid types.UID) Events {
	if uid != "" {
		sel[fieldObjectUID] = string(uid)
	}
	evs, err := listEvents(ctx, c, namespace, sel)
	if err != nil {
		return Events{Error: eventsError(namespace, err)}
	}
	return eventViews(now, evs)
}

// OwnerExplanation is explain for a workload rather than a pod: `explain
// --job NAME`, or `explain NAME` when no live pod has that name. A pod
// that the webhook (or any admission) refuses never exists and has no
// events of its own; its controller (the Job, a Deployment's ReplicaSet,
// a StatefulSet) records each refusal as a FailedCreate event carrying the
// webhook's message.
type OwnerExplanation struct {
	Namespace string `json:"namespace"`
	// Kind and Name are the workload's (Kind from its events when it was
	// not named by a flag).
	Kind string `json:"kind"`
	Name string `json:"name"`
	// Refused is how many pod creations failed (the FailedCreate events'
	// counts): pods refused at creation.
	Refused int    `json:"refused"`
	Events  Events `json:"events"`
	// Pods are the workload's live pods, by name.
	Pods []OwnedPod `json:"pods,omitempty"`
}

// OwnedPod is one live pod of a workload, for `explain POD` on it.
type OwnedPod struct {
	Name  string `json:"name"`
	Phase string `json:"phase"`
	Node  string `json:"node,omitempty"`
	// Scheduled is the PodScheduled condition's status and reason, e.g.
	// "False Unschedulable"; empty when not set.
	Scheduled string `json:"scheduled,omitempty"`
}

// explainJob explains the Job name: its events and its pods.
func explainJob(ctx context.Context, c client.Reader, s *Snapshot, namespace, name string) (*OwnerExplanation, error) {
	var job batchv1.Job
	err := c.Get(ctx, client.ObjectKey{Namespace: namespace, Name: name}, &job)
	switch {
	case apierrors.IsNotFound(err):
		return nil, fmt.Errorf("job %s/%s not found", namespace, name)
	case err != nil && !apierrors.IsForbidden(err):
		return nil, fmt.Errorf("get job %s/%s: %w", namespace, name, err)
	}
	o := &OwnerExplanation{Namespace: namespace, Kind: "Job", Name: name,
		Events: objectEvents(ctx, c, s.Now, namespace, fields.Set{fieldObjectKind: "Job", fieldObjectName: name}, job.UID)}
	o.finish(s)
	return o, nil
}

// explainOwner looks for the workload named name when no pod is: the
// events of every object of that name but a Pod, and, for a Deployment,
// the FailedCreate events of its ReplicaSets (named <name>-<hash>). It
// returns nil when there are none.
func explainOwner(ctx context.Context, c client.Reader, s *Snapshot, namespace, name string) (*OwnerExplanation, error) {
	evs, err := listEvents(ctx, c, namespace, fields.Set{fieldObjectName: name})
	if err != nil {
		if apierrors.IsForbidden(err) {
			return nil, fmt.Errorf("pod %s/%s not found, and its workload's events cannot be read: %s", namespace, name, eventsError(namespace, err))
		}
		return nil, fmt.Errorf("list events of %s/%s: %w", namespace, name, err)
	}
	kept := evs[:0]
	kind := ""
	for _, e := range evs {
		if e.InvolvedObject.Kind == "Pod" {
			continue // an earlier pod of that name
		}
		kept = append(kept, e)
		kind = e.InvolvedObject.Kind
	}
	if kind == "Deployment" {
		rs, err := listEvents(ctx, c, namespace, fields.Set{fieldObjectKind: "ReplicaSet", fieldReason: "FailedCreate"})
		if err != nil {
			return nil, fmt.Errorf("list events of the ReplicaSets of deployment %s/%s: %w", namespace, name, err)
		}
		for _, e := range rs {
			if strings.HasPrefix(e.InvolvedObject.Name, name+"-") {
				kept = append(kept, e)
			}
		}
	}
	if len(kept) == 0 {
		return nil, nil
	}
	o := &OwnerExplanation{Namespace: namespace, Kind: kind, Name: name, Events: eventViews(s.Now, kept)}
	o.finish(s)
	return o, nil
}

// finish counts the refusals and lists the workload's live pods: those a
// controller of this kind and name owns (a Deployment's through its
// ReplicaSets).
func (o *OwnerExplanation) finish(s *Snapshot) {
	for _, e := range o.Events.Items {
		if e.Reason == "FailedCreate" {
			o.Refused += int(e.Count)
		}
	}
	for i := range s.Pods {
		p := &s.Pods[i]
		if p.Namespace != o.Namespace || !ownedBy(p, o.Kind, o.Name) {
			continue
		}
		op := OwnedPod{Name: p.Name, Phase: string(p.Status.Phase), Node: p.Spec.NodeName}
		if op.Phase == "" {
			op.Phase = string(corev1.PodPending)
		}
		if c := podScheduled(p); c != nil {
			op.Scheduled = strings.TrimSpace(string(c.Status) + " " + c.Reason)
		}
		o.Pods = append(o.Pods, op)
	}
}

func ownedBy(p *corev1.Pod, kind, name string) bool {
	ref := metav1.GetControllerOf(p)
	if ref == nil {
		return false
	}
	if kind == "Deployment" {
		return ref.Kind == "ReplicaSet" && strings.HasPrefix(ref.Name, name+"-")
	}
	return ref.Kind == kind && ref.Name == name
}

func podScheduled(p *corev1.Pod) *corev1.PodCondition {
	for i := range p.Status.Conditions {
		if c := &p.Status.Conditions[i]; c.Type == corev1.PodScheduled {
			return c
		}
	}
	return nil
}
