package kubectlplugin

import (
	"context"
	"fmt"
	"os"
	"sort"
	"strings"
	"time"

	corev1 "k8s.io/api/core/v1"
	resourcev1 "k8s.io/api/resource/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/apimachinery/pkg/api/meta"
	"k8s.io/apimachinery/pkg/runtime"
	clientgoscheme "k8s.io/client-go/kubernetes/scheme"
	"k8s.io/client-go/rest"
	"k8s.io/dynamic-resource-allocation/resourceclaim"
	"sigs.k8s.io/controller-runtime/pkg/client"

	configv1alpha1 "github.com/gputopo/gputopo/api/config/v1alpha1"
	"github.com/gputopo/gputopo/api/v1alpha1"
)

// Snapshot is the cluster as one command sees it: read once, then every
// view is computed from it.
type Snapshot struct {
	Now        time.Time
	Nodes      []corev1.Node
	Topologies []v1alpha1.NodeGPUTopology
	// Pods are the live pods of every namespace (finished ones hold no GPU
	// and are left out).
	Pods []corev1.Pod
	// Config is the extender's configuration explain decides with;
	// ConfigSource says where it came from.
	Config       *configv1alpha1.ExtenderConfiguration
	ConfigSource string
	// Plans are what the deciding scheduler holds for groups (GroupPlan):
	// GPUs planned for a group's pods or kept for a waiting group.
	// PlansUnread says why they could not be read ("" when they were).
	Plans       []v1alpha1.GroupPlan
	PlansUnread string
	// Claims and Slices are the cluster's ResourceClaims and
	// ResourceSlices: the GPUs of pods that ask for them through claims
	// (Config.DRA, docs/dra.md). ClaimsUnread says why they could not be
	// read ("" when they were).
	Claims       []resourcev1.ResourceClaim
	Slices       []resourcev1.ResourceSlice
	ClaimsUnread string
	// claimDevices maps the DRA driver's pool and device names to GPU
	// UUIDs, built from Slices on first use.
	claimDevices map[[2]string]string
}

// ConfigFrom says where the extender's configuration is read from: a file
// (File), else a ConfigMap (Namespace/Name, key config.yaml, as the chart
// writes it). A ConfigMap that is missing or unreadable means the defaults.
type ConfigFrom struct {
	File      string
	ConfigMap string
}

func scheme() *runtime.Scheme {
	s := runtime.NewScheme()
	_ = clientgoscheme.AddToScheme(s)
	_ = v1alpha1.AddToScheme(s)
	return s
}

// Load reads a Snapshot with the REST config.
func Load(ctx context.Context, cfg *rest.Config, from ConfigFrom) (*Snapshot, error) {
	c, err := client.New(cfg, client.Options{Scheme: scheme()})
	if err != nil {
		return nil, fmt.Errorf("kubernetes client: %w", err)
	}
	return LoadWith(ctx, c, from)
}

// LoadWith reads a Snapshot with a client.
func LoadWith(ctx context.Context, c client.Reader, from ConfigFrom) (*Snapshot, error) {
	s := &Snapshot{Now: time.Now()}
	var nodes corev1.NodeList
	if err := c.List(ctx, &nodes); err != nil {
		return nil, fmt.Errorf("list nodes: %w", err)
	}
	s.Nodes = nodes.Items
	var topos v1alpha1.NodeGPUTopologyList
	if err := c.List(ctx, &topos); err != nil {
		return nil, fmt.Errorf("list nodegputopologies (is the gputopo CRD installed?): %w", err)
	}
	s.Topologies = topos.Items
	var pods corev1.PodList
	if err := c.List(ctx, &pods); err != nil {
		return nil, fmt.Errorf("list pods: %w", err)
	}
	for _, p := range pods.Items {
		if p.Status.Phase != corev1.PodSucceeded && p.Status.Phase != corev1.PodFailed {
			s.Pods = append(s.Pods, p)
		}
	}
	var plans v1alpha1.GroupPlanList
	if err := c.List(ctx, &plans); err != nil {
		s.PlansUnread = fmt.Sprintf("GPUs planned or kept for groups not shown: list groupplans.gputopo.io: %v", err)
	}
	s.Plans = plans.Items
	var claims resourcev1.ResourceClaimList
	var slices resourcev1.ResourceSliceList
	if err := c.List(ctx, &claims); meta.IsNoMatchError(err) {
		// The cluster serves no DRA: there are no claims to show.
	} else if err != nil {
		s.ClaimsUnread = fmt.Sprintf("GPUs held through DRA ResourceClaims not shown: list resourceclaims.resource.k8s.io: %v", err)
	} else if err := c.List(ctx, &slices); err != nil {
		s.ClaimsUnread = fmt.Sprintf("GPUs held through DRA ResourceClaims not shown: list resourceslices.resource.k8s.io: %v", err)
	} else {
		s.Claims, s.Slices = claims.Items, slices.Items
	}
	cfg, src, err := loadConfig(ctx, c, from)
	if err != nil {
		return nil, err
	}
	s.Config, s.ConfigSource = cfg, src
	s.sort()
	return s, nil
}

func loadConfig(ctx context.Context, c client.Reader, from ConfigFrom) (*configv1alpha1.ExtenderConfiguration, string, error) {
	if from.File != "" {
		b, err := os.ReadFile(from.File)
		if err != nil {
			return nil, "", fmt.Errorf("read extender configuration: %w", err)
		}
		cfg, err := configv1alpha1.ParseExtender(b)
		if err != nil {
			return nil, "", fmt.Errorf("extender configuration %s: %w", from.File, err)
		}
		return cfg, from.File, nil
	}
	if from.ConfigMap == "" {
		return configv1alpha1.DefaultExtenderConfiguration(), "defaults", nil
	}
	ns, name, ok := strings.Cut(from.ConfigMap, "/")
	if !ok || ns == "" || name == "" {
		return nil, "", fmt.Errorf("--extender-configmap %q: want NAMESPACE/NAME", from.ConfigMap)
	}
	var cm corev1.ConfigMap
	err := c.Get(ctx, client.ObjectKey{Namespace: ns, Name: name}, &cm)
	switch {
	case apierrors.IsNotFound(err) || apierrors.IsForbidden(err):
		return configv1alpha1.DefaultExtenderConfiguration(), "defaults (ConfigMap " + from.ConfigMap + " not readable)", nil
	case err != nil:
		return nil, "", fmt.Errorf("read ConfigMap %s: %w", from.ConfigMap, err)
	}
	data, ok := cm.Data["config.yaml"]
	if !ok {
		return configv1alpha1.DefaultExtenderConfiguration(), "defaults (ConfigMap " + from.ConfigMap + " has no config.yaml)", nil
	}
	cfg, err := configv1alpha1.ParseExtender([]byte(data))
	if err != nil {
		return nil, "", fmt.Errorf("ConfigMap %s config.yaml: %w", from.ConfigMap, err)
	}
	return cfg, "ConfigMap " + from.ConfigMap, nil
}

func (s *Snapshot) sort() {
	sort.Slice(s.Nodes, func(i, j int) bool { return s.Nodes[i].Name < s.Nodes[j].Name })
	sort.Slice(s.Topologies, func(i, j int) bool { return s.Topologies[i].Name < s.Topologies[j].Name })
	sort.Slice(s.Pods, func(i, j int) bool {
		if s.Pods[i].Namespace != s.Pods[j].Namespace {
			return s.Pods[i].Namespace < s.Pods[j].Namespace
		}
		return s.Pods[i].Name < s.Pods[j].Name
	})
}

func (s *Snapshot) resource() corev1.ResourceName { return s.Config.GPUResource() }

func (s *Snapshot) topology(name string) *v1alpha1.NodeGPUTopology {
	for i := range s.Topologies {
		if s.Topologies[i].Name == name {
			return &s.Topologies[i]
		}
	}
	return nil
}

func (s *Snapshot) node(name string) *corev1.Node {
	for i := range s.Nodes {
		if s.Nodes[i].Name == name {
			return &s.Nodes[i]
		}
	}
	return nil
}

// pod finds a live pod.
func (s *Snapshot) pod(namespace, name string) *corev1.Pod {
	for i := range s.Pods {
		if s.Pods[i].Namespace == namespace && s.Pods[i].Name == name {
			return &s.Pods[i]
		}
	}
	return nil
}

// demand is the pod's GPU count by the project's one rule; a pod whose
// demand cannot be read counts as none.
func demand(p *corev1.Pod, resource corev1.ResourceName) int {
	n, err := v1alpha1.PodGPUDemand(&p.Spec, resource)
	if err != nil {
		return 0
	}
	return int(n)
}

// claimHold is what a pod asks and holds through its ResourceClaims of
// the served classes: asked, the exact counts of their requests; gpus,
// the UUIDs of the driver's devices allocated to them; claims, the
// claims (namespace/name) that ask for GPUs.
type claimHold struct {
	asked  int
	gpus   []string
	claims []string
}

// claimsOf reads pod p's ResourceClaims (a claim from a template once
// the claim exists) as the scheduler counts them.
func (s *Snapshot) claimsOf(p *corev1.Pod) claimHold {
	var h claimHold
	if len(p.Spec.ResourceClaims) == 0 || len(s.Claims) == 0 {
		return h
	}
	if s.claimDevices == nil {
		s.claimDevices = map[[2]string]string{}
		for i := range s.Slices {
			sl := &s.Slices[i]
			if sl.Spec.Driver != s.Config.DRA.Driver {
				continue
			}
			for j := range sl.Spec.Devices {
				if u := s.Config.DRA.DeviceUUID(&sl.Spec.Devices[j]); u != "" {
					s.claimDevices[[2]string{sl.Spec.Pool.Name, sl.Spec.Devices[j].Name}] = u
				}
			}
		}
	}
	for _, pc := range p.Spec.ResourceClaims {
		name, _, err := resourceclaim.Name(p, &pc)
		if err != nil || name == nil {
			continue
		}
		for i := range s.Claims {
			c := &s.Claims[i]
			if c.Namespace != p.Namespace || c.Name != *name {
				continue
			}
			n, err := configv1alpha1.ServedGPUs(c.Spec.Devices.Requests, s.Config.DRA.DeviceClasses)
			if err != nil || n == 0 {
				break
			}
			h.asked += n
			h.claims = append(h.claims, c.Namespace+"/"+c.Name)
			if c.Status.Allocation == nil {
				break
			}
			for _, r := range c.Status.Allocation.Devices.Results {
				if u, ok := s.claimDevices[[2]string{r.Pool, r.Device}]; ok && r.Driver == s.Config.DRA.Driver {
					h.gpus = append(h.gpus, u)
				}
			}
			break
		}
	}
	return h
}

// gpuNodeNames are the nodes gputopo places on: those with a
// NodeGPUTopology or advertising the GPU resource.
func (s *Snapshot) gpuNodeNames() []string {
	seen := map[string]bool{}
	var out []string
	for _, t := range s.Topologies {
		seen[t.Name] = true
		out = append(out, t.Name)
	}
	for _, n := range s.Nodes {
		if q, ok := n.Status.Allocatable[s.resource()]; ok && !q.IsZero() && !seen[n.Name] {
			out = append(out, n.Name)
		}
	}
	sort.Strings(out)
	return out
}
