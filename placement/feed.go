package placement

import (
	corev1 "k8s.io/api/core/v1"
	schedulingv1beta1 "k8s.io/api/scheduling/v1beta1"
	"k8s.io/apimachinery/pkg/types"

	"github.com/gputopo/gputopo/api/v1alpha1"
	"github.com/gputopo/gputopo/placement/ledger"
)

// Feed is how the cluster's objects reach the core's ledger: the cluster
// runtime's informers (package placement/cluster), or a caller that feeds
// the core itself (the simulator, `kubectl gputopo explain`, tests).
// Upserts take the object as an informer delivers it, and the core may
// keep parts of it: an object fed must not change afterwards (a cache's
// objects never do); deletes take keys, so that no tombstone type reaches
// the core.
type Feed interface {
	UpsertTopology(*v1alpha1.NodeGPUTopology)
	DeleteTopology(name string)
	UpsertNode(*corev1.Node)
	DeleteNode(name string)
	// UpsertPod records a pod as it is now; DeletePod forgets the pod key
	// with UID uid (a recreated pod of that name is kept).
	UpsertPod(*corev1.Pod)
	DeletePod(key types.NamespacedName, uid types.UID)
	UpsertPodGroup(*schedulingv1beta1.PodGroup)
	DeletePodGroup(key types.NamespacedName)
	// UpsertClaim records an allocated ResourceClaim's GPUs (DRA, its
	// status.allocation resolved to UUIDs); DeleteClaim forgets a claim
	// that is gone or deallocated.
	UpsertClaim(ledger.ClaimAllocation)
	DeleteClaim(uid types.UID)
	// SetDRADevices records the GPU UUIDs a DRA driver's ResourceSlices
	// publish on a node (none: it serves no GPU there).
	SetDRADevices(node, driver string, uuids []string)
	// TopologiesListed says the initial list of NodeGPUTopologies is in:
	// a GPU UUID listed from then on by a second node is that node's
	// later claim.
	TopologiesListed()
	// SetExternalTelemetry records a successful external (Prometheus)
	// telemetry round; RefreshExternalTelemetry re-decides every node's
	// telemetry source after a failed one, so that samples age out.
	SetExternalTelemetry(ledger.ExternalTelemetry)
	RefreshExternalTelemetry()
}

// Feed is the core's ledger as its callers feed it.
func (x *Core) Feed() Feed { return x.ledger }
