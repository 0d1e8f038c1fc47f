// Package v1alpha1 holds the configuration files of gputopo's components,
// their defaults and their validation, with one strict decoder for all of
// them:
//
//   - ExtenderConfiguration (config.gputopo.io/v1alpha1; the legacy
//     gputopo.io/v1alpha1 is still accepted), the extender's and the
//     scheduler plugin's --config: prioritize weights and their profiles,
//     staleness limits, timeouts, the telemetry source, the GPU resource.
//     DefaultExtenderConfiguration, SetExtenderDefaults, ParseExtender,
//     LoadExtender.
//   - WebhookConfiguration (config.gputopo.io/v1alpha1), the admission
//     webhook's --config, with the policy table that turns a workload's
//     intent into a requirement (PolicyTable, Policy.Requirement), which
//     the simulator uses too. DefaultWebhookConfiguration, ParseWebhook,
//     LoadWebhook.
//   - NodeAgentConfiguration (config.gputopo.io/v1alpha1), the node
//     agent's settings, which it takes as flags (nodeagent.Options), and
//     the device list strategies. DefaultNodeAgentConfiguration,
//     ParseNodeAgent.
//
// Decode states the decoder's rules. testdata/*/defaults.json pin the
// defaults (regenerate with UPDATE_GOLDEN=1 go test ./api/config/v1alpha1).
//
// Importers alias it configv1alpha1. Like api/v1alpha1, the wire contract
// it builds on, it imports only API machinery and libraries
// (k8s.io/apimachinery, k8s.io/api, sigs.k8s.io/yaml and json, Prometheus'
// name rules) and github.com/gputopo/gputopo/api/v1alpha1, never a
// component: every component imports it.
package v1alpha1
