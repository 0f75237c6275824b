//! Helpers shared by the reconcilers, one concern a file: what they read of Pods and
//! Services (`objects`), IP addresses (`addresses`), endpoint identity and sets
//! (`endpoint_set`), EndpointSlice identity (`slices`), the last-change trigger time
//! (`trigger_time`). The well-known labels and annotations come from
//! `conventions::labels`, shared with the agent.
//!
//! Upstream: <https://github.com/kubernetes/kubernetes/blob/v1.37.2/staging/src/k8s.io/endpointslice/util/controller_utils.go>
//! and <https://github.com/kubernetes/kubernetes/blob/v1.37.2/pkg/controller/util/endpoint/controller_utils.go>.

mod addresses;
mod endpoint_set;
mod objects;
mod slices;
mod trigger_time;

pub use addresses::*;
pub use conventions::labels::{
    ANNOTATION_LAST_APPLIED, ANNOTATION_LEADER, ANNOTATION_OVER_CAPACITY, ANNOTATION_TRIGGER_TIME,
    CONTROLLER_NAME, ENDPOINTS_CONTROLLER_NAME, LABEL_ENDPOINTS_MANAGED_BY, LABEL_HEADLESS,
    LABEL_MANAGED_BY, LABEL_SERVICE_NAME, LABEL_SKIP_MIRROR, LABEL_ZONE, MIRRORING_CONTROLLER_NAME,
};
pub use endpoint_set::*;
pub use objects::*;
pub use slices::*;
pub use trigger_time::*;

#[cfg(test)]
mod tests {
    use super::slices::NAME_ALPHABET;
    use super::*;
    use k8s_openapi::api::discovery::v1::Endpoint;

    #[test]
    fn ipv6_detection_matches_go() {
        assert!(is_ipv6("fd00::1"));
        assert!(!is_ipv6("10.0.0.1"));
        assert!(!is_ipv6("::ffff:10.0.0.1"));
        assert!(!is_ipv6("not-an-ip"));
        assert_eq!(address_type_of("bad"), None);
    }

    #[test]
    fn suffix_is_stable_and_in_alphabet() {
        let a = name_suffix("default/web/0");
        assert_eq!(a, name_suffix("default/web/0"));
        assert_eq!(a.len(), 5);
        assert!(a.bytes().all(|b| NAME_ALPHABET.contains(&b)));
    }

    #[test]
    fn slice_prefix_falls_back() {
        assert_eq!(slice_prefix("web"), "web-");
        assert_eq!(slice_prefix("Bad_Name"), "endpointslice-");
    }

    #[test]
    fn endpoint_set_pops_in_insertion_order() {
        let mut set = EndpointSet::new();
        for ip in ["10.0.0.2", "10.0.0.1", "10.0.0.3"] {
            set.insert(Endpoint {
                addresses: vec![ip.into()],
                ..Default::default()
            });
        }
        set.delete(&Endpoint {
            addresses: vec!["10.0.0.1".into()],
            ..Default::default()
        });
        assert_eq!(set.len(), 2);
        assert_eq!(set.pop_any().unwrap().addresses, vec!["10.0.0.2"]);
        assert_eq!(set.pop_any().unwrap().addresses, vec!["10.0.0.3"]);
        assert!(set.pop_any().is_none());
    }
}
