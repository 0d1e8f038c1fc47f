package cluster

import (
	"context"
	"time"

	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/client-go/kubernetes"
	toolscache "k8s.io/client-go/tools/cache"
	"sigs.k8s.io/controller-runtime/pkg/client"

	"github.com/gputopo/gputopo/placement"
)

// clusterAPI is the API server through the core's client, with the
// informer caches answering reads where they can.
type clusterAPI struct {
	client      kubernetes.Interface
	bindTimeout time.Duration
	// cache is the informer cache (stripped pods and nodes) once started.
	cache client.Reader
	// podStore and nodeStore are the host's informer stores with
	// HostInformers (they answer bind's reads instead of cache).
	podStore, nodeStore toolscache.Store
}

// ClientAPI is bind's API over a clientset alone, with no informer cache:
// every read asks the API server. A core fed by its caller binds through
// it (tests that bind against a fake or real API server).
func ClientAPI(cs kubernetes.Interface, bindTimeout time.Duration) placement.API {
	return &clusterAPI{client: cs, bindTimeout: bindTimeout}
}

// Pod reads the informer cache when it holds this very pod, else the API
// server: besides settling, the only read bind makes.
func (a *clusterAPI) Pod(ctx context.Context, key types.NamespacedName, uid types.UID) (*corev1.Pod, error) {
	x := a
	if x.podStore != nil {
		if o, ok, err := x.podStore.GetByKey(key.String()); err == nil && ok {
			if p, ok := o.(*corev1.Pod); ok && p.UID == uid {
				return p, nil
			}
		}
	} else if x.cache != nil {
		p := &corev1.Pod{}
		if err := x.cache.Get(ctx, key, p); err == nil && p.UID == uid {
			return p, nil
		}
	}
	gctx, cancel := context.WithTimeout(ctx, x.bindTimeout)
	defer cancel()
	return a.FreshPod(gctx, key)
}

func (a *clusterAPI) FreshPod(ctx context.Context, key types.NamespacedName) (*corev1.Pod, error) {
	return a.client.CoreV1().Pods(key.Namespace).Get(ctx, key.Name, metav1.GetOptions{})
}

// Node reads the node from the informer cache, which watches every Node
// (the extender may list and watch nodes, not get them): a node it has not
// seen does not exist, or was created a moment ago and is bound to on
// kube-scheduler's retry. Without informers it asks the API server.
func (a *clusterAPI) Node(ctx context.Context, name string) (*corev1.Node, error) {
	x := a
	if x.nodeStore != nil {
		o, ok, err := x.nodeStore.GetByKey(name)
		if err != nil {
			return nil, err
		}
		n, isNode := o.(*corev1.Node)
		if !ok || !isNode {
			return nil, apierrors.NewNotFound(corev1.Resource("nodes"), name)
		}
		return n, nil
	}
	if x.cache != nil {
		n := &corev1.Node{}
		if err := x.cache.Get(ctx, types.NamespacedName{Name: name}, n); err != nil {
			return nil, err
		}
		return n, nil
	}
	gctx, cancel := context.WithTimeout(ctx, x.bindTimeout)
	defer cancel()
	return x.client.CoreV1().Nodes().Get(gctx, name, metav1.GetOptions{})
}

func (a *clusterAPI) Bind(ctx context.Context, b *corev1.Binding) error {
	return a.client.CoreV1().Pods(b.Namespace).Bind(ctx, b, metav1.CreateOptions{})
}
