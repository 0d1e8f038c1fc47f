// Package fakeapi is the API server double of the in-process users of the
// decision core (the simulator, unit tests): a client-go fake clientset
// that answers pods/binding as kube-apiserver does.
package fakeapi

import (
	"fmt"
	"sync"

	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/runtime/schema"
	"k8s.io/client-go/kubernetes/fake"
	k8stesting "k8s.io/client-go/testing"
)

// PodsGVR is the pods resource, as the fake tracker keys it.
var PodsGVR = schema.GroupVersionResource{Version: "v1", Resource: "pods"}

// BindingReactor makes a client-go fake clientset answer pods/binding
// as kube-apiserver does, for the simulator and tests that drive the
// extender without an API server: UID
// precondition, conflict when already bound, and the Binding's annotations
// copied onto the pod in the same write that sets nodeName.
func BindingReactor(cs *fake.Clientset) k8stesting.ReactionFunc {
	var mu sync.Mutex
	return func(action k8stesting.Action) (bool, runtime.Object, error) {
		ca, ok := action.(k8stesting.CreateAction)
		if !ok || ca.GetSubresource() != "binding" {
			return false, nil, nil
		}
		mu.Lock()
		defer mu.Unlock()
		b, ok := ca.GetObject().(*corev1.Binding)
		if !ok {
			return true, nil, fmt.Errorf("binding: got %T", ca.GetObject())
		}
		obj, err := cs.Tracker().Get(PodsGVR, b.Namespace, b.Name)
		if err != nil {
			return true, nil, err
		}
		pod := obj.(*corev1.Pod).DeepCopy()
		if b.UID != "" && b.UID != pod.UID {
			return true, nil, apierrors.NewConflict(PodsGVR.GroupResource(), b.Name, fmt.Errorf("precondition failed: UID %s, pod has %s", b.UID, pod.UID))
		}
		if pod.Spec.NodeName != "" {
			return true, nil, apierrors.NewConflict(PodsGVR.GroupResource(), b.Name, fmt.Errorf("pod %s is already assigned to node %q", b.Name, pod.Spec.NodeName))
		}
		pod.Spec.NodeName = b.Target.Name
		for k, v := range b.Annotations {
			if pod.Annotations == nil {
				pod.Annotations = map[string]string{}
			}
			pod.Annotations[k] = v
		}
		return true, b, cs.Tracker().Update(PodsGVR, pod, pod.Namespace)
	}
}

// NewClientset is a fake clientset holding objs that answers pods/binding
// with BindingReactor.
func NewClientset(objs ...runtime.Object) *fake.Clientset {
	cs := fake.NewClientset(objs...)
	cs.PrependReactor("create", "pods", BindingReactor(cs))
	return cs
}
