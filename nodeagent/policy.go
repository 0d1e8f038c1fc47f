package nodeagent

import (
	"fmt"

	admissionregistrationv1 "k8s.io/api/admissionregistration/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/util/validation"
	"k8s.io/apiserver/pkg/authentication/serviceaccount"
	"k8s.io/utils/ptr"

	"github.com/gputopo/gputopo/api/v1alpha1"
)

// Names of the node agent's admission policies, as kube-apiserver reports
// them in a refusal ("ValidatingAdmissionPolicy 'gputopo-nodeagent-pods'
// with binding ... denied request: ...").
const (
	PolicyPodsSuffix       = "-pods"
	PolicyTopologiesSuffix = "-topologies"
)

// PolicyOptions name the node agent's service account and the policies.
type PolicyOptions struct {
	// Name prefixes the policy and binding names (the chart's
	// "<release>-nodeagent"); the pods policy is Name+PolicyPodsSuffix.
	Name string
	// Namespace and ServiceAccount are the node agent's service account.
	Namespace      string
	ServiceAccount string
}

// User is the service account's user name as kube-apiserver authenticates
// it.
func (o PolicyOptions) User() string {
	return serviceaccount.MakeUsername(o.Namespace, o.ServiceAccount)
}

// The expressions below are CEL evaluated by kube-apiserver itself
// (ValidatingAdmissionPolicy, GA since Kubernetes 1.30): the limits hold
// with the webhook down, and on every pod, not only the pods the webhook
// is sent. They read the node from the user's extra
// authentication.kubernetes.io/node-name, which kube-apiserver records in
// a service account token bound to a pod on a node (the projected token
// kubelet mounts): the agent cannot choose it.
const (
	celNodeVar = "request.userInfo.extra[?'" + serviceaccount.NodeNameKey + "'].orValue([])"
	celHasNode = "size(variables.node) == 1 && variables.node[0] != ''"
)

// nodeMessage is the refusal of a credential that names no node.
const nodeMessage = "the gputopo node agent must authenticate with the service account token bound to its pod (the projected token kubelet mounts), which names its node; a token from a Secret, a TokenRequest bound to nothing or a client certificate names no node and may write nothing"

// AdmissionPolicies are the ValidatingAdmissionPolicies, and their
// bindings, that hold the node agent to its own node inside kube-apiserver.
// RBAC cannot narrow `patch pods` to the pods of one node (kubelet has the
// NodeRestriction admission plugin for that); these policies do the same
// for the agent:
//
//   - on pods it may only UPDATE, only pods bound to the node its token
//     names, and only the annotation gputopo.io/allocated-gpus: spec,
//     labels, finalizers, owner references and every other annotation stay
//     as they are;
//   - it may create, update and delete only the NodeGPUTopology named for
//     its own node (status included).
//
// Both fail closed: a policy that cannot be evaluated refuses the write.
// The chart renders exactly these objects (test/chart compares them).
func AdmissionPolicies(o PolicyOptions) ([]*admissionregistrationv1.ValidatingAdmissionPolicy, []*admissionregistrationv1.ValidatingAdmissionPolicyBinding, error) {
	if err := o.validate(); err != nil {
		return nil, nil, err
	}
	isAgent := []admissionregistrationv1.MatchCondition{{
		Name:       "is-gputopo-node-agent",
		Expression: "request.userInfo.username == '" + o.User() + "'",
	}}
	vars := []admissionregistrationv1.Variable{{Name: "node", Expression: celNodeVar}}
	rule := func(group string, resources ...string) admissionregistrationv1.NamedRuleWithOperations {
		return admissionregistrationv1.NamedRuleWithOperations{RuleWithOperations: admissionregistrationv1.RuleWithOperations{
			Operations: []admissionregistrationv1.OperationType{admissionregistrationv1.Create, admissionregistrationv1.Update, admissionregistrationv1.Delete},
			Rule: admissionregistrationv1.Rule{
				APIGroups: []string{group}, APIVersions: []string{"*"}, Resources: resources,
			},
		}}
	}
	policy := func(suffix string, r admissionregistrationv1.NamedRuleWithOperations, vars []admissionregistrationv1.Variable, validations ...admissionregistrationv1.Validation) *admissionregistrationv1.ValidatingAdmissionPolicy {
		return &admissionregistrationv1.ValidatingAdmissionPolicy{
			TypeMeta:   metav1.TypeMeta{APIVersion: admissionregistrationv1.SchemeGroupVersion.String(), Kind: "ValidatingAdmissionPolicy"},
			ObjectMeta: metav1.ObjectMeta{Name: o.Name + suffix},
			Spec: admissionregistrationv1.ValidatingAdmissionPolicySpec{
				FailurePolicy:    ptr.To(admissionregistrationv1.Fail),
				MatchConstraints: &admissionregistrationv1.MatchResources{ResourceRules: []admissionregistrationv1.NamedRuleWithOperations{r}},
				MatchConditions:  isAgent,
				Variables:        vars,
				Validations:      validations,
			},
		}
	}
	// namesNode refuses a credential that names no node.
	namesNode := func() admissionregistrationv1.Validation {
		return admissionregistrationv1.Validation{Expression: celHasNode, Message: nodeMessage, Reason: ptr.To(metav1.StatusReasonForbidden)}
	}
	allocated := "'" + v1alpha1.AnnotationAllocatedGPUs + "'"
	pods := policy(PolicyPodsSuffix, rule("", "pods", "pods/*"), vars, admissionregistrationv1.Validation{
		Expression:        "request.operation == 'UPDATE' && request.?subResource.orValue('') == ''",
		MessageExpression: "'the gputopo node agent may only update pods, to record ' + " + allocated + " + '; it may not ' + request.operation + (request.?subResource.orValue('') == '' ? ' pods' : ' pods/' + request.?subResource.orValue(''))",
		Reason:            ptr.To(metav1.StatusReasonForbidden),
	}, namesNode(), admissionregistrationv1.Validation{
		Expression: "request.operation != 'UPDATE' || !(" + celHasNode + ") || oldObject.spec.?nodeName.orValue('') == variables.node[0]",
		MessageExpression: "'the gputopo node agent on node \"' + variables.node[0] + '\" may change only pods bound to its own node; pod ' + oldObject.metadata.namespace + '/' + oldObject.metadata.name + " +
			"(oldObject.spec.?nodeName.orValue('') == '' ? ' is bound to no node' : ' is bound to node \"' + oldObject.spec.nodeName + '\"')",
		Reason: ptr.To(metav1.StatusReasonForbidden),
	}, admissionregistrationv1.Validation{
		Expression: "request.operation != 'UPDATE' || (object.spec == oldObject.spec" +
			" && object.metadata.?labels.orValue({}) == oldObject.metadata.?labels.orValue({})" +
			" && object.metadata.?finalizers.orValue([]) == oldObject.metadata.?finalizers.orValue([])" +
			" && object.metadata.?ownerReferences.orValue([]) == oldObject.metadata.?ownerReferences.orValue([]))",
		Message: "the gputopo node agent may change only the annotation " + v1alpha1.AnnotationAllocatedGPUs + " of a pod; its spec, labels, finalizers and owner references are not the agent's to change",
		Reason:  ptr.To(metav1.StatusReasonForbidden),
	}, admissionregistrationv1.Validation{
		Expression: "request.operation != 'UPDATE' || [object.metadata.?annotations.orValue({}), oldObject.metadata.?annotations.orValue({})]" +
			".all(m, m.all(k, k == " + allocated + " || object.metadata.?annotations[?k] == oldObject.metadata.?annotations[?k]))",
		Message: "the gputopo node agent may change only the annotation " + v1alpha1.AnnotationAllocatedGPUs + " of a pod; every other annotation is not the agent's to set, change or remove",
		Reason:  ptr.To(metav1.StatusReasonForbidden),
	})
	target := admissionregistrationv1.Variable{
		Name: "target", Expression: "request.operation == 'DELETE' ? oldObject.metadata.name : object.metadata.name",
	}
	topologies := policy(PolicyTopologiesSuffix, rule(v1alpha1.GroupVersion.Group, "nodegputopologies", "nodegputopologies/*"), append(vars, target), namesNode(), admissionregistrationv1.Validation{
		Expression:        "!(" + celHasNode + ") || variables.target == variables.node[0]",
		MessageExpression: "'the gputopo node agent on node \"' + variables.node[0] + '\" may write only the NodeGPUTopology named \"' + variables.node[0] + '\", not \"' + variables.target + '\"'",
		Reason:            ptr.To(metav1.StatusReasonForbidden),
	})
	policies := []*admissionregistrationv1.ValidatingAdmissionPolicy{pods, topologies}
	bindings := make([]*admissionregistrationv1.ValidatingAdmissionPolicyBinding, len(policies))
	for i, p := range policies {
		bindings[i] = &admissionregistrationv1.ValidatingAdmissionPolicyBinding{
			TypeMeta:   metav1.TypeMeta{APIVersion: admissionregistrationv1.SchemeGroupVersion.String(), Kind: "ValidatingAdmissionPolicyBinding"},
			ObjectMeta: metav1.ObjectMeta{Name: p.Name},
			Spec: admissionregistrationv1.ValidatingAdmissionPolicyBindingSpec{
				PolicyName:        p.Name,
				ValidationActions: []admissionregistrationv1.ValidationAction{admissionregistrationv1.Deny},
			},
		}
	}
	return policies, bindings, nil
}

func (o PolicyOptions) validate() error {
	for what, v := range map[string]string{"name": o.Name, "namespace": o.Namespace, "service account": o.ServiceAccount} {
		if msgs := validation.IsDNS1123Subdomain(v); len(msgs) > 0 {
			return fmt.Errorf("node agent admission policies: %s %q: %v", what, v, msgs)
		}
	}
	return nil
}
