//! Well-known labels, annotations and field values, as upstream spells them
//! (`k8s.io/api/core/v1/well_known_labels.go`, `annotation_key_constants.go`,
//! `k8s.io/api/discovery/v1/well_known_labels.go`:
//! <https://github.com/kubernetes/api/tree/v0.37.2/discovery/v1>,
//! <https://github.com/kubernetes/api/tree/v0.37.2/core/v1>).

/// `kubernetes.io/service-name` (discovery.LabelServiceName): ties an EndpointSlice
/// to its Service.
pub const LABEL_SERVICE_NAME: &str = "kubernetes.io/service-name";
/// `endpointslice.kubernetes.io/managed-by` (discovery.LabelManagedBy).
pub const LABEL_MANAGED_BY: &str = "endpointslice.kubernetes.io/managed-by";
/// `endpointslice.kubernetes.io/skip-mirror` (discovery.LabelSkipMirror).
pub const LABEL_SKIP_MIRROR: &str = "endpointslice.kubernetes.io/skip-mirror";
/// `service.kubernetes.io/headless` (v1.IsHeadlessService): kube-proxy skips the
/// slices of headless Services by it.
pub const LABEL_HEADLESS: &str = "service.kubernetes.io/headless";
/// `service.kubernetes.io/service-proxy-name` (v1.LabelServiceProxyName): hands a
/// Service and its slices to a specific proxy; kube-proxy skips them.
pub const LABEL_SERVICE_PROXY_NAME: &str = "service.kubernetes.io/service-proxy-name";
/// `topology.kubernetes.io/zone` (v1.LabelTopologyZone): a Node's zone, which
/// topology hints are written and read against.
pub const LABEL_ZONE: &str = "topology.kubernetes.io/zone";
/// Node roles whose Nodes do not count for topology hints.
pub const LABEL_NODE_ROLE_CONTROL_PLANE: &str = "node-role.kubernetes.io/control-plane";
/// The older name of [`LABEL_NODE_ROLE_CONTROL_PLANE`].
pub const LABEL_NODE_ROLE_MASTER: &str = "node-role.kubernetes.io/master";

/// `endpoints.kubernetes.io/managed-by`: the label the Endpoints controller puts on
/// the Endpoints it writes, with [`ENDPOINTS_CONTROLLER_NAME`] (`LabelManagedBy` in
/// <https://github.com/kubernetes/kubernetes/blob/v1.37.2/pkg/controller/endpoint/endpoints_controller.go>).
pub const LABEL_ENDPOINTS_MANAGED_BY: &str = "endpoints.kubernetes.io/managed-by";
/// The Endpoints controller's name (`ControllerName` there), the value of
/// [`LABEL_ENDPOINTS_MANAGED_BY`]; kept as upstream's so that either controller
/// finds the other's Endpoints already labelled.
pub const ENDPOINTS_CONTROLLER_NAME: &str = "endpoint-controller";

/// `endpoints.kubernetes.io/last-change-trigger-time`
/// (v1.EndpointsLastChangeTriggerTime): the time of the change an Endpoints or
/// EndpointSlice reflects; the agent measures its programming latency from it.
pub const ANNOTATION_TRIGGER_TIME: &str = "endpoints.kubernetes.io/last-change-trigger-time";
/// `endpoints.kubernetes.io/over-capacity` (v1.EndpointsOverCapacity).
pub const ANNOTATION_OVER_CAPACITY: &str = "endpoints.kubernetes.io/over-capacity";
/// Leader-election record kept on old-style Endpoints locks; such Endpoints are left
/// alone.
pub const ANNOTATION_LEADER: &str = "control-plane.alpha.kubernetes.io/leader";
/// `kubectl.kubernetes.io/last-applied-configuration`
/// (v1.LastAppliedConfigAnnotation).
pub const ANNOTATION_LAST_APPLIED: &str = "kubectl.kubernetes.io/last-applied-configuration";
/// `service.kubernetes.io/topology-mode` (v1.AnnotationTopologyMode).
pub const ANNOTATION_TOPOLOGY_MODE: &str = "service.kubernetes.io/topology-mode";
/// The deprecated `service.kubernetes.io/topology-aware-hints`
/// (v1.DeprecatedAnnotationTopologyAwareHints).
pub const ANNOTATION_TOPOLOGY_AWARE_HINTS: &str = "service.kubernetes.io/topology-aware-hints";

/// The name upstream's EndpointSlice controller writes into [`LABEL_MANAGED_BY`].
pub const CONTROLLER_NAME: &str = "endpointslice-controller.k8s.io";
/// The name upstream's mirroring controller writes into [`LABEL_MANAGED_BY`].
pub const MIRRORING_CONTROLLER_NAME: &str = "endpointslicemirroring-controller.k8s.io";
