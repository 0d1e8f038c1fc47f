package cluster

import (
	"context"
	"slices"
	"sync"

	authorizationv1 "k8s.io/api/authorization/v1"
	corev1 "k8s.io/api/core/v1"
	resourcev1 "k8s.io/api/resource/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	toolscache "k8s.io/client-go/tools/cache"
	"k8s.io/klog/v2"
	"sigs.k8s.io/controller-runtime/pkg/client"

	configv1alpha1 "github.com/gputopo/gputopo/api/config/v1alpha1"
	"github.com/gputopo/gputopo/placement"
	"github.com/gputopo/gputopo/placement/ledger"
)

// draTracker feeds the ledger the GPUs DRA allocated (docs/dra.md): each
// allocated ResourceClaim's devices of the configured driver, resolved to
// GPU UUIDs through the driver's ResourceSlices (a device's UUID
// attribute), held for the pod the claim is reserved for. The claim's
// status.allocation is the truth; the ledger follows it.
type draTracker struct {
	feed placement.Feed
	// refeed feeds the ledger again the pending pods of a namespace that
	// use a claim (or template) just seen; nil: none.
	refeed func(ns string, uses func(corev1.PodResourceClaim) bool)
	driver string
	attr   []string // the UUID attribute's names, as written and as the driver's domain qualifies it

	mu sync.Mutex
	// devices maps a slice's pool and device name to its node and UUID;
	// bySlice lists what each slice added, so that an update replaces it.
	devices map[poolDevice]nodeGPU
	bySlice map[string][]poolDevice
	nodeOf  map[string]string // slice -> node
	// claims are the allocated claims with devices of the driver, by UID.
	claims map[types.UID]*resourcev1.ResourceClaim
}

type poolDevice struct{ pool, device string }

type nodeGPU struct{ node, uuid string }

func newDRATracker(feed placement.Feed, cfg configv1alpha1.DRA) *draTracker {
	t := &draTracker{feed: feed, driver: cfg.Driver, devices: map[poolDevice]nodeGPU{}, bySlice: map[string][]poolDevice{}, nodeOf: map[string]string{}, claims: map[types.UID]*resourcev1.ResourceClaim{}}
	t.attr = cfg.UUIDAttributes()
	return t
}

// FeedDRA feeds feed what the DRA objects say, as the runtime's
// informers would: each slice of cfg's driver (SetDRADevices), then each
// allocated claim's GPUs (UpsertClaim). For a core fed from a snapshot
// (kubectl gputopo explain).
func FeedDRA(feed placement.Feed, cfg configv1alpha1.DRA, slices []resourcev1.ResourceSlice, claims []resourcev1.ResourceClaim) {
	t := newDRATracker(feed, cfg)
	for i := range slices {
		t.upsertSlice(&slices[i])
	}
	for i := range claims {
		t.upsertClaim(&claims[i])
	}
}

// UUIDReader reads the UUID a device of cfg's driver carries in its UUID
// attribute, as configured or qualified by the driver's domain ("" when
// none).
func UUIDReader(cfg configv1alpha1.DRA) func(*resourcev1.Device) string {
	return newDRATracker(nil, cfg).uuidOf
}

func (t *draTracker) uuidOf(d *resourcev1.Device) string {
	for _, a := range t.attr {
		if v, ok := d.Attributes[resourcev1.QualifiedName(a)]; ok && v.StringValue != nil {
			return *v.StringValue
		}
	}
	return ""
}

func (t *draTracker) handlers() (slices, claims, templates toolscache.ResourceEventHandlerFuncs) {
	return handler(t.upsertSlice, func(m metav1.Object) { t.deleteSlice(m.GetName()) }),
		handler(t.upsertClaim, func(m metav1.Object) { t.deleteClaim(m.GetUID()) }),
		handler(func(tmpl *resourcev1.ResourceClaimTemplate) {
			if t.refeed != nil {
				t.refeed(tmpl.Namespace, func(pc corev1.PodResourceClaim) bool {
					return pc.ResourceClaimTemplateName != nil && *pc.ResourceClaimTemplateName == tmpl.Name
				})
			}
		}, func(metav1.Object) {})
}

// refeedClaimPods returns what feeds the ledger again the pending pods of
// a namespace that use a claim or template just seen: a pod seen before
// its claim or template counted no GPUs through it (claimGPUs).
func (r *Runtime) refeedClaimPods(ctx context.Context, c client.Reader) func(ns string, uses func(corev1.PodResourceClaim) bool) {
	return func(ns string, uses func(corev1.PodResourceClaim) bool) {
		var pods []*corev1.Pod
		if host := r.opts.HostInformers; host != nil {
			for _, o := range host.Pods.GetStore().List() {
				if p, ok := o.(*corev1.Pod); ok && p.Namespace == ns {
					pods = append(pods, p)
				}
			}
		} else {
			var l corev1.PodList
			if err := c.List(ctx, &l, client.InNamespace(ns)); err != nil {
				return
			}
			for i := range l.Items {
				pods = append(pods, &l.Items[i])
			}
		}
		for _, p := range pods {
			if p.Spec.NodeName == "" && slices.ContainsFunc(p.Spec.ResourceClaims, uses) {
				r.core.Feed().UpsertPod(p)
			}
		}
	}
}

func (t *draTracker) upsertSlice(s *resourcev1.ResourceSlice) {
	if s.Spec.Driver != t.driver {
		return
	}
	t.mu.Lock()
	defer t.mu.Unlock()
	t.dropSliceLocked(s.Name)
	node := ""
	if s.Spec.NodeName != nil {
		node = *s.Spec.NodeName
	}
	var added []poolDevice
	for i := range s.Spec.Devices {
		d := &s.Spec.Devices[i]
		u := t.uuidOf(d)
		if node == "" || u == "" {
			continue
		}
		k := poolDevice{s.Spec.Pool.Name, d.Name}
		t.devices[k] = nodeGPU{node, u}
		added = append(added, k)
	}
	t.bySlice[s.Name] = added
	t.nodeOf[s.Name] = node
	t.publishLocked(node)
	t.resyncLocked()
}

func (t *draTracker) deleteSlice(name string) {
	t.mu.Lock()
	defer t.mu.Unlock()
	node := t.nodeOf[name]
	t.dropSliceLocked(name)
	t.publishLocked(node)
	t.resyncLocked()
}

func (t *draTracker) dropSliceLocked(name string) {
	for _, k := range t.bySlice[name] {
		delete(t.devices, k)
	}
	delete(t.bySlice, name)
	delete(t.nodeOf, name)
}

// publishLocked tells the ledger every GPU UUID the driver's slices list
// on node now.
func (t *draTracker) publishLocked(node string) {
	if node == "" {
		return
	}
	var uuids []string
	for _, g := range t.devices {
		if g.node == node {
			uuids = append(uuids, g.uuid)
		}
	}
	slices.Sort(uuids)
	t.feed.SetDRADevices(node, t.driver, uuids)
}

func (t *draTracker) upsertClaim(c *resourcev1.ResourceClaim) {
	if t.refeed != nil && c.Status.Allocation == nil {
		t.refeed(c.Namespace, func(pc corev1.PodResourceClaim) bool {
			return pc.ResourceClaimName != nil && *pc.ResourceClaimName == c.Name
		})
	}
	t.mu.Lock()
	defer t.mu.Unlock()
	if !t.hasDevices(c) {
		if _, ok := t.claims[c.UID]; ok {
			delete(t.claims, c.UID)
			t.feed.DeleteClaim(c.UID)
		}
		return
	}
	t.claims[c.UID] = c
	t.feedLocked(c)
}

func (t *draTracker) deleteClaim(uid types.UID) {
	t.mu.Lock()
	defer t.mu.Unlock()
	if _, ok := t.claims[uid]; ok {
		delete(t.claims, uid)
		t.feed.DeleteClaim(uid)
	}
}

// hasDevices says whether c is allocated devices of the driver.
func (t *draTracker) hasDevices(c *resourcev1.ResourceClaim) bool {
	if c.Status.Allocation == nil {
		return false
	}
	for _, r := range c.Status.Allocation.Devices.Results {
		if r.Driver == t.driver {
			return true
		}
	}
	return false
}

// resyncLocked feeds every tracked claim again: a slice that came or
// changed may resolve devices a claim named before it was seen.
func (t *draTracker) resyncLocked() {
	for _, c := range t.claims {
		t.feedLocked(c)
	}
}

func (t *draTracker) feedLocked(c *resourcev1.ResourceClaim) {
	a := ledger.ClaimAllocation{Claim: types.NamespacedName{Namespace: c.Namespace, Name: c.Name}, UID: c.UID}
	if rf := c.Status.ReservedFor; len(rf) == 1 && rf[0].Resource == "pods" && rf[0].APIGroup == "" {
		a.Pod, a.PodUID = types.NamespacedName{Namespace: c.Namespace, Name: rf[0].Name}, rf[0].UID
	}
	for _, r := range c.Status.Allocation.Devices.Results {
		if r.Driver != t.driver || r.AdminAccess != nil && *r.AdminAccess {
			continue
		}
		g, ok := t.devices[poolDevice{r.Pool, r.Device}]
		if !ok {
			continue // its slice not seen yet: fed again when it is
		}
		if a.Node != "" && a.Node != g.node {
			klog.Background().V(2).Info("claim allocates GPUs of two nodes; only the first node's are counted", "claim", a.Claim, "nodes", []string{a.Node, g.node})
			continue
		}
		a.Node = g.node
		a.UUIDs = append(a.UUIDs, g.uuid)
	}
	t.feed.UpsertClaim(a)
}

// claimGPUs is how many GPUs pod p asks through its ResourceClaims, read
// from the informer cache: a claim from a template counts the template's
// requests (its claim may not exist yet), a named claim its own. 0 while
// an object is not in the cache yet, or for a request gputopo cannot
// choose for (the plugin's PreFilter says why).
func (r *Runtime) claimGPUs(p *corev1.Pod) int {
	c := r.draCache.Load()
	if c == nil {
		return 0
	}
	ctx := context.Background()
	total := 0
	for _, pc := range p.Spec.ResourceClaims {
		var reqs []resourcev1.DeviceRequest
		switch {
		case pc.ResourceClaimTemplateName != nil:
			var t resourcev1.ResourceClaimTemplate
			if (*c).Get(ctx, types.NamespacedName{Namespace: p.Namespace, Name: *pc.ResourceClaimTemplateName}, &t) != nil {
				return 0
			}
			reqs = t.Spec.Spec.Devices.Requests
		case pc.ResourceClaimName != nil:
			var rc resourcev1.ResourceClaim
			if (*c).Get(ctx, types.NamespacedName{Namespace: p.Namespace, Name: *pc.ResourceClaimName}, &rc) != nil {
				return 0
			}
			reqs = rc.Spec.Devices.Requests
		}
		n, err := configv1alpha1.ServedGPUs(reqs, r.cfg.DRA.DeviceClasses)
		if err != nil {
			return 0
		}
		total += n
	}
	return total
}

// servesDRA says whether the cluster serves ResourceSlices and
// ResourceClaims (resource.k8s.io/v1), which the runtime then watches.
func (r *Runtime) servesDRA(ctx context.Context) bool {
	if r.client == nil {
		return false
	}
	rl, err := r.client.Discovery().ServerResourcesForGroupVersion(resourcev1.SchemeGroupVersion.String())
	if err != nil {
		klog.FromContext(ctx).V(2).Info("DRA not served; GPUs through ResourceClaims are not tracked", "groupVersion", resourcev1.SchemeGroupVersion.String(), "err", err)
		return false
	}
	served := map[string]bool{}
	for _, r := range rl.APIResources {
		served[r.Name] = true
	}
	for _, res := range draResources {
		if !served[res] {
			return false
		}
		// Without list and watch an informer never syncs, and the
		// runtime would wait for it forever: say so and track no claims.
		for _, verb := range []string{"list", "watch"} {
			review := &authorizationv1.SelfSubjectAccessReview{Spec: authorizationv1.SelfSubjectAccessReviewSpec{
				ResourceAttributes: &authorizationv1.ResourceAttributes{Group: resourcev1.GroupName, Resource: res, Verb: verb}}}
			got, err := r.client.AuthorizationV1().SelfSubjectAccessReviews().Create(ctx, review, metav1.CreateOptions{})
			if err != nil || !got.Status.Allowed {
				klog.FromContext(ctx).Info("not allowed to "+verb+" "+res+": GPUs through ResourceClaims are not tracked; grant the role the chart installs (docs/dra.md)", "err", err)
				return false
			}
		}
	}
	return true
}

// draResources are what the runtime watches of resource.k8s.io/v1.
var draResources = []string{"resourceslices", "resourceclaims", "resourceclaimtemplates"}
