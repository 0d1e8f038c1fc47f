package kubectlplugin

import configv1alpha1 "github.com/gputopo/gputopo/api/config/v1alpha1"

// fabricDomain is the node's tightest fabric domain as the picture groups
// it, "<level>=<value>": the first of the extender configuration's fabric
// levels (the defaults when it has none), tightest first, whose labels the
// Node carries, the level's first such label giving the value. Like the
// ledger, a node without the tightest level's labels is in its
// NodeGPUTopology's fabric clique there when it has one. "" when none.
func (s *Snapshot) fabricDomain(name string) string {
	levels := configv1alpha1.DefaultFabricLevels()
	if s.Config != nil && s.Config.Fabric.Levels != nil {
		levels = s.Config.Fabric.Levels
	}
	var labels map[string]string
	if n := s.node(name); n != nil {
		labels = n.Labels
	}
	for i, l := range levels {
		for _, k := range l.Labels {
			if v := labels[k]; v != "" {
				return l.Name + "=" + v
			}
		}
		if i > 0 {
			continue
		}
		if t := s.topology(name); t != nil {
			for _, g := range t.Status.GPUs {
				if g.FabricClique != "" {
					return l.Name + "=" + g.FabricClique
				}
			}
		}
	}
	return ""
}
