package simulator

import (
	"fmt"
	"maps"
	"strconv"

	configv1alpha1 "github.com/gputopo/gputopo/api/config/v1alpha1"
	"github.com/gputopo/gputopo/api/v1alpha1"
	"github.com/gputopo/gputopo/topology"
)

// gangGputopo runs a job's pods through the decision core, each through
// the gputopo policy's Filter, Score and Bind on the simulated API. All
// of a job's pods are created (and reach the ledger) when the job is
// first tried, as a Job controller creates them; then its pods not bound
// yet are placed in turn until one is refused.
//
// With grouped set (GangGputopo) the pods carry the group annotations, so
// the first one filtered plans the whole group and holds every slot, or
// holds nothing and is refused; its members then go to their slots. Without
// (GangPerPod) the same core sees independent pods, and the ones placed
// hold their GPUs while the job waits for the rest.
type gangGputopo struct {
	*gputopoPolicy
	name    string
	grouped bool
	// groups numbers the groups, for their names.
	groups int
}

var _ GangPolicy = (*gangGputopo)(nil)

func newGangGputopo(name string, nodes []Node, ext *configv1alpha1.ExtenderConfiguration, table configv1alpha1.PolicyTable) (*gangGputopo, error) {
	p, err := newGputopoPolicy(nodes, ext, table)
	if err != nil {
		return nil, err
	}
	return &gangGputopo{gputopoPolicy: p, name: name, grouped: name == GangGputopo}, nil
}

func (g *gangGputopo) Name() string { return g.name }

// memberID is how p.pods knows pod i of a job of several pods.
func memberID(job Job, i int) string { return job.ID + "#" + strconv.Itoa(i) }

func (g *gangGputopo) Place(job Job, have []Placement, free []topology.Mask) ([]Placement, error) {
	n := job.PodCount()
	if n == 1 {
		pl, ok, err := g.gputopoPolicy.Place(job, free)
		if err != nil || !ok {
			return nil, err
		}
		return []Placement{pl}, nil
	}
	if _, ok := g.pods[memberID(job, 0)]; !ok {
		var ann map[string]string
		if g.grouped {
			g.groups++
			ann = map[string]string{
				v1alpha1.AnnotationGroup:     "group-" + strconv.Itoa(g.groups),
				v1alpha1.AnnotationGroupSize: strconv.Itoa(n),
			}
		}
		if g.grouped && job.Slices() > 0 {
			ann[v1alpha1.AnnotationSliceSize] = strconv.Itoa(job.SliceSize)
			ann[v1alpha1.AnnotationSliceRequiredTopology] = job.SliceLevel
			if job.GroupLevel != "" {
				ann[v1alpha1.AnnotationGroupRequiredTopology] = job.GroupLevel
			}
		}
		for i := range n {
			a := ann
			if g.grouped && job.Slices() > 0 {
				// Member i is rank i: slice i / SliceSize, as the
				// engine measures it.
				a = maps.Clone(ann)
				a[v1alpha1.AnnotationRank] = strconv.Itoa(i)
			}
			if _, err := g.newPod(memberID(job, i), fmt.Sprintf("%s-%d", job.ID, i), job, a); err != nil {
				return nil, err
			}
		}
	}
	var out []Placement
	// The pods are placed in member order and stop at the first refused,
	// so the first len(have) are the ones bound.
	for i := len(have); i < n; i++ {
		id := memberID(job, i)
		pl, ok, err := g.placePod(id, g.pods[id])
		if err != nil {
			return nil, err
		}
		if !ok {
			break
		}
		out = append(out, pl)
	}
	return out, nil
}

// Release deletes the job's pods, as the informer would report them.
func (g *gangGputopo) Release(job Job, _ []Placement) error { return g.Drop(job, nil) }

func (g *gangGputopo) Drop(job Job, _ []Placement) error {
	if job.PodCount() == 1 {
		return g.gputopoPolicy.Drop(job)
	}
	for i := range job.PodCount() {
		if err := g.deletePod(memberID(job, i)); err != nil {
			return err
		}
	}
	return nil
}
