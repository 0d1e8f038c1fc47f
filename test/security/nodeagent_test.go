//go:build integration

package security

import (
	"context"
	"strings"
	"testing"
	"time"

	authenticationv1 "k8s.io/api/authentication/v1"
	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	"sigs.k8s.io/controller-runtime/pkg/client"

	"github.com/gputopo/gputopo/api/v1alpha1"
	"github.com/gputopo/gputopo/nodeagent"
	"github.com/gputopo/gputopo/test/harness"
	"github.com/gputopo/gputopo/topology/machine"
)

// A compromised GPU node, attempted with its node agent's real credential
// (a service account token bound to the agent's pod, as kubelet mounts it)
// against kube-apiserver with the node agent's RBAC and admission policies
// installed exactly as the chart renders them (nodeagent.AdmissionPolicies;
// test/chart compares the two), and no webhook at all: kube-apiserver
// alone must hold the agent to its own node.
//
//	KUBEBUILDER_ASSETS=$PWD/bin go test -tags integration -count=1 ./test/security/ -run NodeAgent -v
func TestNodeAgentTokenIsHeldToItsNode(t *testing.T) {
	cp := harness.Start(t, harness.Options{})
	ctx := context.Background()
	c := cp.Client
	policies, bindings, err := nodeagent.AdmissionPolicies(nodeagent.PolicyOptions{Name: agentSA, Namespace: whRelease, ServiceAccount: agentSA})
	if err != nil {
		t.Fatal(err)
	}
	objs := []client.Object{
		namespace(whRelease, false), namespace(whPlain, false),
	}
	objs = append(objs, agentAccount()...)
	for _, p := range policies {
		objs = append(objs, p)
	}
	for _, b := range bindings {
		objs = append(objs, b)
	}
	for _, obj := range objs {
		if err := c.Create(ctx, obj); err != nil {
			t.Fatalf("create %T %s: %v", obj, obj.GetName(), err)
		}
	}
	cp.CreateGPUNode(t, nodeA, 8, nil)
	cp.CreateGPUNode(t, nodeB, 8, nil)
	agentPod := &corev1.Pod{
		ObjectMeta: metav1.ObjectMeta{Namespace: whRelease, Name: "gputopo-nodeagent-a"},
		Spec: corev1.PodSpec{ServiceAccountName: agentSA, NodeName: nodeA, Containers: []corev1.Container{{
			Name: "agent", Image: "ghcr.io/gputopo/gputopo:0.2.0"}}},
	}
	onA, onB, systemB := gpuPod(whPlain, "worker-a"), gpuPod(whPlain, "worker-b"), cpuPod("kube-system", "dns-b")
	onA.Spec.NodeName, onB.Spec.NodeName, systemB.Spec.NodeName = nodeA, nodeB, nodeB
	onA.Labels, onB.Labels, systemB.Labels = map[string]string{"app": "train"}, map[string]string{"app": "train"}, map[string]string{"k8s-app": "dns"}
	for _, p := range []*corev1.Pod{agentPod, onA, onB, systemB} {
		if err := c.Create(ctx, p); err != nil {
			t.Fatalf("create pod %s: %v", p.Name, err)
		}
	}
	agent := agentClient(t, cp, &authenticationv1.BoundObjectReference{Kind: "Pod", APIVersion: "v1", Name: agentPod.Name, UID: agentPod.UID})
	patch := func(cl client.Client, p *corev1.Pod, body string) error {
		return cl.Patch(ctx, p.DeepCopy(), client.RawPatch(types.StrategicMergePatchType, []byte(body)))
	}
	record := `{"metadata":{"annotations":{"` + v1alpha1.AnnotationAllocatedGPUs + `":"` + uuidOwn + `"}}}`

	// The policies take effect once kube-apiserver has loaded them.
	harness.Poll(t, 30*time.Second, "the node agent policies to be enforced", func() (bool, string) {
		err := patch(agent, onB, `{"metadata":{"labels":{"probe":"1"}}}`)
		return err != nil && strings.Contains(err.Error(), agentSA+nodeagent.PolicyPodsSuffix), errString(err)
	})

	otherNode := `the gputopo node agent on node "` + nodeA + `" may change only pods bound to its own node`
	onlyAnnotation := "the gputopo node agent may change only the annotation " + v1alpha1.AnnotationAllocatedGPUs
	for _, tc := range []struct {
		name string
		pod  *corev1.Pod
		body string
		want string
	}{
		{"change the image of a pod on another node", onB, `{"spec":{"containers":[{"name":"main","image":"evil.example/miner:1"}]}}`, otherNode},
		{"relabel a kube-system pod on another node", systemB, `{"metadata":{"labels":{"k8s-app":"evil"}}}`, otherNode},
		{"kill a pod on another node with activeDeadlineSeconds", onB, `{"spec":{"activeDeadlineSeconds":1}}`, otherNode},
		{"record allocated GPUs on a pod of another node", onB, record, otherNode + "; pod " + whPlain + "/worker-b is bound to node \"" + nodeB + "\""},
		{"change the image of a pod on its own node", onA, `{"spec":{"containers":[{"name":"main","image":"evil.example/miner:1"}]}}`, onlyAnnotation + " of a pod; its spec, labels"},
		{"kill a pod on its own node with activeDeadlineSeconds", onA, `{"spec":{"activeDeadlineSeconds":1}}`, onlyAnnotation + " of a pod; its spec, labels"},
		{"relabel a pod on its own node", onA, `{"metadata":{"labels":{"app":"evil"}}}`, onlyAnnotation + " of a pod; its spec, labels"},
		{"add a finalizer to a pod on its own node", onA, `{"metadata":{"finalizers":["evil.example/hold"]}}`, onlyAnnotation + " of a pod; its spec, labels"},
		{"write the plan on a pod of its own node", onA, `{"metadata":{"annotations":{"` + v1alpha1.AnnotationAssignedGPUs + `":"` + uuidOther + `"}}}`, onlyAnnotation + " of a pod; every other annotation"},
		{"set a foreign annotation on a pod of its own node", onA, `{"metadata":{"annotations":{"team":"evil"}}}`, onlyAnnotation + " of a pod; every other annotation"},
	} {
		t.Run("refused: "+tc.name, func(t *testing.T) {
			before := &corev1.Pod{}
			if err := c.Get(ctx, client.ObjectKeyFromObject(tc.pod), before); err != nil {
				t.Fatal(err)
			}
			err := patch(agent, tc.pod, tc.body)
			refusedByPolicy(t, tc.name, err, agentSA+nodeagent.PolicyPodsSuffix, tc.want)
			after := &corev1.Pod{}
			if err := c.Get(ctx, client.ObjectKeyFromObject(tc.pod), after); err != nil {
				t.Fatal(err)
			}
			if after.ResourceVersion != before.ResourceVersion {
				t.Errorf("pod %s changed (resourceVersion %s -> %s) although the write was refused", tc.pod.Name, before.ResourceVersion, after.ResourceVersion)
			}
		})
	}

	t.Run("allowed: record allocated GPUs on a pod of its own node, and change them", func(t *testing.T) {
		for _, uuid := range []string{uuidOwn, uuidOther} {
			if err := patch(agent, onA, `{"metadata":{"annotations":{"`+v1alpha1.AnnotationAllocatedGPUs+`":"`+uuid+`"}}}`); err != nil {
				t.Fatalf("the agent of node A recording %s on its own pod: %v", uuid, err)
			}
			got := &corev1.Pod{}
			if err := c.Get(ctx, client.ObjectKeyFromObject(onA), got); err != nil {
				t.Fatal(err)
			}
			if v := got.Annotations[v1alpha1.AnnotationAllocatedGPUs]; v != uuid {
				t.Errorf("allocated-gpus = %q, want %q", v, uuid)
			}
		}
	})

	t.Run("refused: a token that names no node, even for its own records", func(t *testing.T) {
		unbound := agentClient(t, cp, nil)
		refusedByPolicy(t, "an unbound token recording allocated GPUs", patch(unbound, onA, record), agentSA+nodeagent.PolicyPodsSuffix,
			"must authenticate with the service account token bound to its pod")
		topo := topologyOf(t, nodeA)
		refusedByPolicy(t, "an unbound token creating its node's topology", unbound.Create(ctx, topo), agentSA+nodeagent.PolicyTopologiesSuffix,
			"must authenticate with the service account token bound to its pod")
	})

	t.Run("NodeGPUTopology: only the object named for its own node", func(t *testing.T) {
		wrongNode := `the gputopo node agent on node "` + nodeA + `" may write only the NodeGPUTopology named "` + nodeA + `", not "`
		refusedByPolicy(t, "create another node's topology", agent.Create(ctx, topologyOf(t, nodeB)), agentSA+nodeagent.PolicyTopologiesSuffix, wrongNode+nodeB+`"`)
		refusedByPolicy(t, "create a topology for a node that does not exist", agent.Create(ctx, topologyOf(t, "gpu-node-ghost")), agentSA+nodeagent.PolicyTopologiesSuffix, wrongNode+`gpu-node-ghost"`)

		// Node B's own topology, published by its agent (here, the admin).
		dgx, err := machine.FixtureByName("dgx-a100")
		if err != nil {
			t.Fatal(err)
		}
		cp.PublishTopology(t, nodeB, dgx)
		theirs := &v1alpha1.NodeGPUTopology{}
		if err := c.Get(ctx, client.ObjectKey{Name: nodeB}, theirs); err != nil {
			t.Fatal(err)
		}
		lie := theirs.DeepCopy()
		for i := range lie.Status.GPUs {
			lie.Status.GPUs[i].Health = v1alpha1.GPUUnhealthy
		}
		refusedByPolicy(t, "mark every GPU of another node unhealthy", agent.Status().Update(ctx, lie), agentSA+nodeagent.PolicyTopologiesSuffix, wrongNode+nodeB+`"`)
		after := &v1alpha1.NodeGPUTopology{}
		if err := c.Get(ctx, client.ObjectKey{Name: nodeB}, after); err != nil {
			t.Fatal(err)
		}
		if after.ResourceVersion != theirs.ResourceVersion {
			t.Errorf("node B's topology changed although the write was refused")
		}

		own := topologyOf(t, nodeA)
		if err := agent.Create(ctx, own); err != nil {
			t.Fatalf("the agent of node A creating its own topology: %v", err)
		}
		own.Status = dgx.Graph(nodeA).Status()
		own.Status.ObservedTime = metav1.Now()
		if err := agent.Status().Update(ctx, own); err != nil {
			t.Fatalf("the agent of node A publishing its own topology's status: %v", err)
		}
	})
}

// topologyOf is an empty NodeGPUTopology for node, as the publisher
// creates it before it writes the status.
func topologyOf(t *testing.T, node string) *v1alpha1.NodeGPUTopology {
	t.Helper()
	return &v1alpha1.NodeGPUTopology{ObjectMeta: metav1.ObjectMeta{Name: node}}
}

// refusedByPolicy asserts err is kube-apiserver's refusal by the named
// ValidatingAdmissionPolicy, saying each of want.
func refusedByPolicy(t *testing.T, what string, err error, policy string, want ...string) {
	t.Helper()
	if err == nil {
		t.Errorf("%s: admitted; want it refused by ValidatingAdmissionPolicy %s", what, policy)
		return
	}
	msg := err.Error()
	if !apierrors.IsForbidden(err) && !apierrors.IsInvalid(err) {
		t.Errorf("%s: error %q is not a refusal", what, msg)
	}
	if !strings.Contains(msg, "ValidatingAdmissionPolicy '"+policy+"'") {
		t.Errorf("%s: error %q does not name ValidatingAdmissionPolicy %s", what, msg, policy)
	}
	for _, w := range want {
		if !strings.Contains(msg, w) {
			t.Errorf("%s: error %q\ndoes not say %q", what, msg, w)
		}
	}
}

func errString(err error) string {
	if err == nil {
		return "admitted"
	}
	return err.Error()
}
