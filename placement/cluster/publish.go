package cluster

import (
	"context"
	"fmt"
	"strings"
	"time"

	"k8s.io/apimachinery/pkg/api/equality"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/client-go/rest"
	"k8s.io/klog/v2"
	"sigs.k8s.io/controller-runtime/pkg/client"

	"github.com/gputopo/gputopo/api/v1alpha1"
	"github.com/gputopo/gputopo/placement/ledger"
)

// PublishPeriod is how often the deciding scheduler publishes what it holds
// for groups (GroupPlan objects).
const PublishPeriod = 2 * time.Second

// publisher keeps one GroupPlan object per group the core holds GPUs for
// (a plan, or GPUs kept for a waiting group), in the group's namespace,
// and deletes those of groups it no longer holds anything for: bound
// whole, given up, gone. Only the deciding scheduler publishes; a new
// decider starts from the objects the last one left.
type publisher struct {
	c client.Client
	// last is what is published, by object; nil until listed.
	last map[types.NamespacedName]v1alpha1.GroupPlanSpec
}

// publish runs one round: it writes what changed since the last one.
func (r *Runtime) publish(ctx context.Context) {
	if !r.holdsDecider() || r.restCfg == nil {
		return // only the scheduler that holds the decider Lease publishes
	}
	r.pub.ready(ctx, r)
	p := &r.pub
	if p.c == nil || p.last == nil {
		return
	}
	p.round(ctx, r.core.Report().Held(), r.opts.Identity)
}

// holdsDecider says whether this scheduler decides now: it leads and holds
// the decider Lease. Unlike DeciderRefusal it never starts the election
// (a shadow, or a replica that never schedules, must not take the Lease).
func (r *Runtime) holdsDecider() bool {
	d := r.decider.Load()
	return d != nil && d.holding.Load() && r.Leading()
}

// adoptPlans restores, when this scheduler takes the decider Lease over,
// the plans the previous decider published for groups whose pods are not
// all bound (Core.AdoptPlan), so that it binds them where that plan put
// them and shows the same plan.
func (r *Runtime) adoptPlans(ctx context.Context) {
	if r.restCfg == nil {
		return
	}
	p := &r.pub
	p.last = nil // list again: the previous decider wrote since
	p.ready(ctx, r)
	log := klog.FromContext(ctx)
	for key, spec := range p.last {
		if spec.State != v1alpha1.GroupPlanned {
			continue
		}
		group := key.Namespace + "/" + key.Name
		ok := r.core.Upkeep().AdoptPlan(ctx, group, spec.Domain, spec.Level, spec.Slots)
		log.Info("plan published by the previous decider", "group", group, "adopted", ok, "decider", spec.Decider)
	}
}

// ready makes p's client and lists what is published, once.
func (p *publisher) ready(ctx context.Context, r *Runtime) {
	log := klog.FromContext(ctx)
	if p.c == nil {
		// gputopo's own objects speak JSON (a host scheduler's config asks
		// for protobuf).
		cfg := rest.CopyConfig(r.restCfg)
		cfg.ContentType, cfg.AcceptContentTypes = runtime.ContentTypeJSON, runtime.ContentTypeJSON
		c, err := client.New(cfg, client.Options{Scheme: scheme()})
		if err != nil {
			log.Error(err, "GroupPlans not published: no client")
			return
		}
		p.c = c
	}
	if p.last == nil {
		var l v1alpha1.GroupPlanList
		if err := p.c.List(ctx, &l); err != nil {
			log.V(2).Info("GroupPlans not published: list failed", "err", err)
			return
		}
		p.last = map[types.NamespacedName]v1alpha1.GroupPlanSpec{}
		for _, o := range l.Items {
			p.last[types.NamespacedName{Namespace: o.Namespace, Name: o.Name}] = o.Spec
		}
	}
}

// round publishes held: it creates or replaces the objects whose spec
// changed since the last round and deletes those of groups held no more.
func (p *publisher) round(ctx context.Context, held []ledger.Held, identity string) {
	log := klog.FromContext(ctx)
	want := map[types.NamespacedName]v1alpha1.GroupPlanSpec{}
	for _, h := range held {
		ns, name, ok := strings.Cut(h.Group, "/")
		if !ok {
			continue
		}
		want[types.NamespacedName{Namespace: ns, Name: name}] = planSpec(h, identity)
	}
	for key, spec := range want {
		if old, ok := p.last[key]; ok && equality.Semantic.DeepEqual(old, spec) {
			continue
		}
		if err := p.write(ctx, key, spec); err != nil {
			log.V(2).Info("GroupPlan not written", "group", key, "err", err)
			continue
		}
		p.last[key] = spec
	}
	for key := range p.last {
		if _, ok := want[key]; ok {
			continue
		}
		o := &v1alpha1.GroupPlan{ObjectMeta: metav1.ObjectMeta{Namespace: key.Namespace, Name: key.Name}}
		if err := p.c.Delete(ctx, o); err != nil && !apierrors.IsNotFound(err) {
			log.V(2).Info("GroupPlan not deleted", "group", key, "err", err)
			continue
		}
		delete(p.last, key)
	}
}

// write creates or replaces the GroupPlan key.
func (p *publisher) write(ctx context.Context, key types.NamespacedName, spec v1alpha1.GroupPlanSpec) error {
	o := &v1alpha1.GroupPlan{}
	err := p.c.Get(ctx, key, o)
	switch {
	case apierrors.IsNotFound(err):
		o = &v1alpha1.GroupPlan{ObjectMeta: metav1.ObjectMeta{Namespace: key.Namespace, Name: key.Name}, Spec: spec}
		return p.c.Create(ctx, o)
	case err != nil:
		return fmt.Errorf("get: %w", err)
	}
	o.Spec = spec
	return p.c.Update(ctx, o)
}

// planSpec is h as published.
func planSpec(h ledger.Held, decider string) v1alpha1.GroupPlanSpec {
	s := v1alpha1.GroupPlanSpec{State: v1alpha1.GroupKept, Since: metav1.NewTime(h.Since.Truncate(time.Second)), Domain: h.Domain,
		Level: h.Level, Priority: h.Priority, Decider: decider, Slots: make([]v1alpha1.GroupPlanSlot, 0, len(h.Slots))}
	if h.Planned {
		s.State = v1alpha1.GroupPlanned
	}
	for _, sl := range h.Slots {
		s.Slots = append(s.Slots, v1alpha1.GroupPlanSlot{Node: sl.Node, GPUs: sl.GPUs, UUIDs: sl.UUIDs, Pod: sl.Pod})
	}
	return s
}
