package nodeagent

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"sync"
	"time"

	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/apimachinery/pkg/api/meta"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/util/retry"
	"k8s.io/klog/v2"
	"sigs.k8s.io/controller-runtime/pkg/client"

	"github.com/gputopo/gputopo/api/v1alpha1"
)

// TelemetryThresholds say how much a GPU's readings must move before the
// publisher writes them. Small wobble (an idle GPU between 30 and 31 °C)
// is not news to the extender and would cost one API write per node per
// interval: 33 writes a second on a 1,000-node cluster at 30 s.
type TelemetryThresholds struct {
	// UtilizationPercent: points of compute utilization. Default 10.
	UtilizationPercent int32
	// TemperatureC: degrees. Default 5.
	TemperatureC int32
	// PowerPercentOfLimit: power draw change as a percentage of the power
	// limit. Default 10.
	PowerPercentOfLimit int32
	// MemoryPercent: memory used change as a percentage of the GPU's total.
	// Default 5.
	MemoryPercent int32
}

// DefaultTelemetryThresholds are the thresholds used when none are given.
var DefaultTelemetryThresholds = TelemetryThresholds{UtilizationPercent: 10, TemperatureC: 5, PowerPercentOfLimit: 10, MemoryPercent: 5}

// PublisherOptions configure a Publisher.
type PublisherOptions struct {
	// NodeName names the Node and the NodeGPUTopology.
	NodeName string
	// TopologyInterval: how often topology and health are re-read and the
	// object rewritten (its observedTime is the agent's heartbeat).
	// Default 5m.
	TopologyInterval time.Duration
	// TelemetryInterval: how often telemetry is read; it is written only
	// when it moved beyond Thresholds. Default 30s.
	TelemetryInterval time.Duration
	// Thresholds; zero value means DefaultTelemetryThresholds.
	Thresholds TelemetryThresholds
	// Always, when true, writes telemetry at every read (thresholds off);
	// for measuring what the thresholds save.
	Always bool
}

func (o *PublisherOptions) defaults() {
	if o.TopologyInterval <= 0 {
		o.TopologyInterval = 5 * time.Minute
	}
	if o.TelemetryInterval <= 0 {
		o.TelemetryInterval = 30 * time.Second
	}
	if o.Thresholds == (TelemetryThresholds{}) {
		o.Thresholds = DefaultTelemetryThresholds
	}
}

// Publisher keeps the node's NodeGPUTopology current: topology and health
// every TopologyInterval and at once when health changes, telemetry every
// TelemetryInterval but written only when it moved. When NVML fails it
// keeps publishing the last good topology marked Stale.
type Publisher struct {
	client  client.Client
	src     Source
	opts    PublisherOptions
	metrics *Metrics
	logger  klog.Logger

	mu         sync.Mutex
	obj        *v1alpha1.NodeGPUTopology // last written, with its resourceVersion
	status     v1alpha1.NodeGPUTopologyStatus
	lastGood   *v1alpha1.NodeGPUTopologyStatus
	topoAt     time.Time
	telAt      time.Time
	onTopology []func(v1alpha1.NodeGPUTopologyStatus)
}

// NewPublisher builds a publisher; metrics may be nil.
func NewPublisher(c client.Client, src Source, opts PublisherOptions, metrics *Metrics, logger klog.Logger) *Publisher {
	opts.defaults()
	return &Publisher{client: c, src: src, opts: opts, metrics: metrics, logger: logger}
}

// OnTopology registers fn to be called with every topology read (good or
// stale), before it is written; the device plugin takes GPUs and health
// from it.
func (p *Publisher) OnTopology(fn func(v1alpha1.NodeGPUTopologyStatus)) {
	p.mu.Lock()
	defer p.mu.Unlock()
	p.onTopology = append(p.onTopology, fn)
}

// Status returns what was last read (not necessarily written).
func (p *Publisher) Status() v1alpha1.NodeGPUTopologyStatus {
	p.mu.Lock()
	defer p.mu.Unlock()
	return copyStatus(p.status)
}

// Run publishes until ctx ends.
func (p *Publisher) Run(ctx context.Context) error {
	tick := time.NewTicker(min(p.opts.TelemetryInterval, p.opts.TopologyInterval))
	defer tick.Stop()
	if err := p.Sync(ctx, time.Now(), true); err != nil {
		p.logger.Error(err, "Publishing NodeGPUTopology failed; retrying at the next tick")
	}
	for {
		force := false
		select {
		case <-ctx.Done():
			return nil
		case <-p.src.HealthChanged():
			force = true
		case <-tick.C:
		}
		if err := p.Sync(ctx, time.Now(), force); err != nil {
			p.logger.Error(err, "Publishing NodeGPUTopology failed; retrying at the next tick")
		}
	}
}

// Sync does what is due at now: a topology read when TopologyInterval has
// passed or forceTopology is set, a telemetry read when TelemetryInterval
// has passed; then at most one write, when the topology was read or the
// telemetry moved beyond the thresholds. Time is a parameter so that tests
// and the simulator can run hours of agent time in seconds.
func (p *Publisher) Sync(ctx context.Context, now time.Time, forceTopology bool) error {
	p.mu.Lock()
	defer p.mu.Unlock()
	write := false
	if forceTopology || p.topoAt.IsZero() || now.Sub(p.topoAt) >= p.opts.TopologyInterval {
		p.readTopology(now)
		write = true
	}
	if p.telAt.IsZero() || now.Sub(p.telAt) >= p.opts.TelemetryInterval {
		tel, err := p.src.Telemetry()
		p.telAt = now
		switch {
		case err != nil:
			p.logger.V(2).Info("Reading telemetry failed", "err", err)
		case write || p.opts.Always || p.moved(tel):
			p.status.Telemetry = tel
			p.status.TelemetryTime = metav1.NewTime(now)
			write = true
		}
	}
	if !write {
		return nil
	}
	return p.write(ctx)
}

func (p *Publisher) readTopology(now time.Time) {
	st, err := p.src.Topology()
	p.topoAt = now
	tel, telTime := p.status.Telemetry, p.status.TelemetryTime
	conditions := p.status.Conditions
	switch {
	case err == nil:
		st.Conditions = mergeConditions(conditions, st.Conditions, now)
		p.lastGood = &st
		p.status = st
	case p.lastGood != nil:
		p.status = copyStatus(*p.lastGood)
		p.status.Stale, p.status.StaleReason = true, err.Error()
		p.logger.Info("NVML topology read failed; publishing the last good topology as stale", "err", err)
	default:
		p.status = v1alpha1.NodeGPUTopologyStatus{Stale: true, StaleReason: err.Error()}
		p.logger.Info("NVML topology read failed and no topology was ever read; publishing an empty stale topology", "err", err)
	}
	// A refused read says why on the published (stale) status too.
	var refused *RefusedError
	if errors.As(err, &refused) {
		p.status.Conditions = mergeConditions(conditions, []metav1.Condition{refused.Condition}, now)
	}
	p.status.ObservedTime = metav1.NewTime(now)
	p.status.Telemetry, p.status.TelemetryTime = tel, telTime
	for _, fn := range p.onTopology {
		fn(p.status)
	}
}

// moved reports whether tel differs from the published telemetry beyond
// the thresholds.
func (p *Publisher) moved(tel []v1alpha1.Telemetry) bool {
	old := p.status.Telemetry
	if len(old) != len(tel) {
		return true
	}
	th := p.opts.Thresholds
	for i := range tel {
		a, b := old[i], tel[i]
		var totalMiB int64
		if i < len(p.status.GPUs) {
			totalMiB = p.status.GPUs[i].MemoryMiB
		}
		switch {
		case abs32(a.UtilizationPercent-b.UtilizationPercent) >= th.UtilizationPercent,
			abs32(a.TemperatureC-b.TemperatureC) >= th.TemperatureC,
			a.PowerLimitWatts != b.PowerLimitWatts,
			int64(abs32(a.PowerWatts-b.PowerWatts))*100 >= int64(th.PowerPercentOfLimit)*int64(max(b.PowerLimitWatts, 1)),
			abs64(a.MemoryUsedMiB-b.MemoryUsedMiB)*100 >= int64(th.MemoryPercent)*max(totalMiB, 1),
			!slices.Equal(a.ThrottleReasons, b.ThrottleReasons):
			return true
		}
	}
	return false
}

func abs32(v int32) int32 {
	if v < 0 {
		return -v
	}
	return v
}

func abs64(v int64) int64 {
	if v < 0 {
		return -v
	}
	return v
}

// write stores p.status through the status subresource, creating the
// object (owned by the Node, so it goes when the Node goes) on first use.
// Conflicts are retried on a fresh read.
func (p *Publisher) write(ctx context.Context) error {
	err := retry.RetryOnConflict(retry.DefaultRetry, func() error {
		if p.obj == nil {
			obj, err := p.getOrCreate(ctx)
			if err != nil {
				return err
			}
			p.obj = obj
		}
		obj := p.obj.DeepCopy()
		obj.Status = p.status
		err := p.client.Status().Update(ctx, obj)
		p.metrics.apiWrite("topology", err)
		if err != nil {
			p.obj = nil // re-read before the next attempt
			return err
		}
		p.obj = obj
		return nil
	})
	if err != nil {
		return fmt.Errorf("write NodeGPUTopology %s status: %w", p.opts.NodeName, err)
	}
	return nil
}

func (p *Publisher) getOrCreate(ctx context.Context) (*v1alpha1.NodeGPUTopology, error) {
	obj := &v1alpha1.NodeGPUTopology{}
	err := p.client.Get(ctx, client.ObjectKey{Name: p.opts.NodeName}, obj)
	if err == nil {
		return obj, nil
	}
	if !apierrors.IsNotFound(err) {
		return nil, fmt.Errorf("get NodeGPUTopology %s: %w", p.opts.NodeName, err)
	}
	node := &corev1.Node{}
	if err := p.client.Get(ctx, client.ObjectKey{Name: p.opts.NodeName}, node); err != nil {
		return nil, fmt.Errorf("get node %s for the owner reference: %w", p.opts.NodeName, err)
	}
	obj = &v1alpha1.NodeGPUTopology{ObjectMeta: metav1.ObjectMeta{
		Name: p.opts.NodeName,
		OwnerReferences: []metav1.OwnerReference{{
			APIVersion: "v1", Kind: "Node", Name: node.Name, UID: node.UID,
		}},
	}}
	err = p.client.Create(ctx, obj)
	p.metrics.apiWrite("topology", err)
	if apierrors.IsAlreadyExists(err) {
		return nil, apierrors.NewConflict(v1alpha1.GroupVersion.WithResource("nodegputopologies").GroupResource(), p.opts.NodeName, err)
	}
	if err != nil {
		return nil, fmt.Errorf("create NodeGPUTopology %s: %w", p.opts.NodeName, err)
	}
	return obj, nil
}

// mergeConditions sets each of next on a copy of prev: a condition whose
// status did not change keeps its lastTransitionTime, one that did (or is
// new) gets now.
func mergeConditions(prev, next []metav1.Condition, now time.Time) []metav1.Condition {
	out := append([]metav1.Condition(nil), prev...)
	for _, c := range next {
		c.LastTransitionTime = metav1.NewTime(now)
		meta.SetStatusCondition(&out, c)
	}
	return out
}

func copyStatus(st v1alpha1.NodeGPUTopologyStatus) v1alpha1.NodeGPUTopologyStatus {
	return (&v1alpha1.NodeGPUTopology{Status: st}).DeepCopy().Status
}
