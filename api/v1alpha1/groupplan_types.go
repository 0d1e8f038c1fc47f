package v1alpha1

import (
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
)

// GroupPlanState says what the deciding scheduler holds for a group.
// +kubebuilder:validation:Enum=Planned;Kept
type GroupPlanState string

const (
	// GroupPlanned: the group fits; these GPUs are its pods' until they
	// are bound (fabric.groupReservationTTL).
	GroupPlanned GroupPlanState = "Planned"
	// GroupKept: the group waits (fabric.reserveAfter); these GPUs, free
	// or held, are refused to pods of its priority or lower that come
	// after it.
	GroupKept GroupPlanState = "Kept"
)

// GroupPlanSlot is the GPUs of one node in a plan or reservation.
type GroupPlanSlot struct {
	// Node is the node's name.
	Node string `json:"node"`
	// GPUs are the GPUs' indices on the node, ascending.
	GPUs []int `json:"gpus"`
	// UUIDs are the same GPUs' UUIDs, in the same order.
	UUIDs []string `json:"uuids,omitempty"`
	// Pod is the group's pod that has claimed the slot (Planned), ""
	// while none has.
	Pod string `json:"pod,omitempty"`
}

// GroupPlanSpec is what the decider holds for the group.
type GroupPlanSpec struct {
	// State is Planned or Kept.
	State GroupPlanState `json:"state"`
	// Since is when the plan was made, or when the group was first kept
	// for.
	Since metav1.Time `json:"since"`
	// Domain and Level are the fabric domain the GPUs lie in and its
	// level (fabric.levels; "cluster" for none).
	Domain string `json:"domain,omitempty"`
	Level  string `json:"level,omitempty"`
	// Priority is the group's pods' priority (Kept: pods of this priority
	// or lower are refused the GPUs).
	Priority int32 `json:"priority,omitempty"`
	// Decider is the identity of the scheduler that holds it.
	Decider string `json:"decider,omitempty"`
	// Slots are the GPUs, by node.
	Slots []GroupPlanSlot `json:"slots"`
}

// GroupPlan is what the deciding gputopo scheduler holds for one group of
// pods (docs/groups.md), published so that `kubectl gputopo` and a
// scheduler that takes over see it: the GPUs planned for its pods, or kept
// for it while it waits. It is named after the group, in the group's
// namespace. Only the decider writes it; it is deleted once the group is
// bound whole, is given up or its pods are gone.
// +kubebuilder:object:root=true
// +kubebuilder:resource:scope=Namespaced,shortName=gplan
// +kubebuilder:printcolumn:name="State",type=string,JSONPath=`.spec.state`
// +kubebuilder:printcolumn:name="Domain",type=string,JSONPath=`.spec.domain`
// +kubebuilder:printcolumn:name="Since",type=date,JSONPath=`.spec.since`
type GroupPlan struct {
	metav1.TypeMeta   `json:",inline"`
	metav1.ObjectMeta `json:"metadata,omitempty"`

	Spec GroupPlanSpec `json:"spec"`
}

// GroupPlanList is a list of GroupPlans.
// +kubebuilder:object:root=true
type GroupPlanList struct {
	metav1.TypeMeta `json:",inline"`
	metav1.ListMeta `json:"metadata,omitempty"`
	Items           []GroupPlan `json:"items"`
}
