//! Services and EndpointSlices as the translation reads them, decoded
//! straight from the apiserver's JSON into these types: everything else
//! (managedFields, selectors, status conditions, ownerReferences, other
//! annotations and labels, ...) is skipped by the decoder and never
//! allocated. Cilium does the same with its "slim" Kubernetes types
//! (pkg/k8s/slim). The field names and shapes mirror k8s-openapi's, so the
//! translation reads them the same way; the watches decode `Watched<T>`,
//! whose `ObjectMeta` (what kube's watcher needs: name, namespace,
//! resourceVersion) lives only until the store keeps the `T`.
use std::borrow::Cow;

use k8s_openapi::apimachinery::pkg::apis::meta::v1::ObjectMeta;
use serde::{Deserialize, Deserializer};

use super::{
    store::ANNOTATION_TRIGGER_TIME,
    translate::{
        ANNOTATION_ALGORITHM, ANNOTATION_FORWARDING_MODE, ANNOTATION_MAGLEV_TABLE_SIZE,
        ANNOTATION_METRICS, LABEL_HEADLESS, LABEL_PROXY_NAME, LABEL_SERVICE_NAME,
    },
};

/// The labels the agent reads; any other is dropped while decoding.
const KNOWN_LABELS: &[&str] = &[LABEL_SERVICE_NAME, LABEL_PROXY_NAME, LABEL_HEADLESS];
/// The annotations the agent reads.
const KNOWN_ANNOTATIONS: &[&str] = &[
    ANNOTATION_ALGORITHM,
    ANNOTATION_FORWARDING_MODE,
    ANNOTATION_MAGLEV_TABLE_SIZE,
    ANNOTATION_METRICS,
    ANNOTATION_TRIGGER_TIME,
];

/// The few labels or annotations the agent reads, as a small vector (a
/// B-tree's first node alone would take about half a kilobyte for one entry).
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Known(Vec<(String, String)>);

impl Known {
    pub fn get(&self, key: &str) -> Option<&String> {
        self.0.iter().find(|(k, _)| k == key).map(|(_, v)| v)
    }

    pub fn contains_key(&self, key: &str) -> bool {
        self.get(key).is_some()
    }
}

impl<const N: usize> From<[(String, String); N]> for Known {
    fn from(entries: [(String, String); N]) -> Self {
        entries.into_iter().collect()
    }
}

impl FromIterator<(String, String)> for Known {
    fn from_iter<I: IntoIterator<Item = (String, String)>>(iter: I) -> Self {
        let mut v: Vec<(String, String)> = iter.into_iter().collect();
        v.shrink_to_fit();
        Self(v)
    }
}

/// A map of which only the entries with `keys` are kept; None when none is.
fn known<'de, D: Deserializer<'de>>(
    d: D,
    keys: &'static [&'static str],
) -> Result<Option<Known>, D::Error> {
    struct Visit(&'static [&'static str]);
    impl<'de> serde::de::Visitor<'de> for Visit {
        type Value = Option<Known>;
        fn expecting(&self, f: &mut std::fmt::Formatter) -> std::fmt::Result {
            f.write_str("a map of strings")
        }
        fn visit_unit<E>(self) -> Result<Self::Value, E> {
            Ok(None)
        }
        fn visit_none<E>(self) -> Result<Self::Value, E> {
            Ok(None)
        }
        fn visit_some<D: Deserializer<'de>>(self, d: D) -> Result<Self::Value, D::Error> {
            d.deserialize_map(self)
        }
        fn visit_map<A: serde::de::MapAccess<'de>>(
            self,
            mut map: A,
        ) -> Result<Self::Value, A::Error> {
            let mut out = Vec::new();
            // (serde's Cow always copies the key; the keys are short.)
            while let Some(key) = map.next_key::<Cow<'de, str>>()? {
                if self.0.contains(&key.as_ref()) {
                    out.push((key.into_owned(), map.next_value::<String>()?));
                } else {
                    map.next_value::<serde::de::IgnoredAny>()?;
                }
            }
            Ok((!out.is_empty()).then(|| out.into_iter().collect()))
        }
    }
    d.deserialize_option(Visit(keys))
}

/// A list the apiserver may send as `null` (Go's nil slice without
/// omitempty: an EndpointSlice whose endpoints are all gone has
/// `"endpoints": null`): empty, as k8s-openapi decodes it.
fn null_as_empty<'de, D: Deserializer<'de>, T: Deserialize<'de>>(d: D) -> Result<Vec<T>, D::Error> {
    Ok(Option::<Vec<T>>::deserialize(d)?.unwrap_or_default())
}

fn known_labels<'de, D: Deserializer<'de>>(d: D) -> Result<Option<Known>, D::Error> {
    known(d, KNOWN_LABELS)
}

fn known_annotations<'de, D: Deserializer<'de>>(d: D) -> Result<Option<Known>, D::Error> {
    known(d, KNOWN_ANNOTATIONS)
}

/// `metadata`, as far as the agent reads it.
#[derive(Clone, Debug, Default, PartialEq, Eq, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct Meta {
    pub name: Option<String>,
    pub namespace: Option<String>,
    /// Only while decoding (the watcher's); the store does not keep it.
    #[serde(default)]
    pub resource_version: Option<String>,
    #[serde(default, deserialize_with = "known_labels")]
    pub labels: Option<Known>,
    #[serde(default, deserialize_with = "known_annotations")]
    pub annotations: Option<Known>,
}

#[derive(Clone, Debug, Default, PartialEq, Eq, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct Service {
    #[serde(default)]
    pub metadata: Meta,
    pub spec: Option<ServiceSpec>,
    pub status: Option<ServiceStatus>,
}

#[derive(Clone, Debug, Default, PartialEq, Eq, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct ServiceSpec {
    #[serde(rename = "type")]
    pub type_: Option<String>,
    #[serde(rename = "clusterIP")]
    pub cluster_ip: Option<String>,
    #[serde(rename = "clusterIPs")]
    pub cluster_ips: Option<Vec<String>>,
    #[serde(rename = "externalIPs")]
    pub external_ips: Option<Vec<String>>,
    pub ports: Option<Vec<ServicePort>>,
    pub session_affinity: Option<String>,
    pub session_affinity_config: Option<SessionAffinityConfig>,
    pub load_balancer_source_ranges: Option<Vec<String>>,
    pub internal_traffic_policy: Option<String>,
    pub external_traffic_policy: Option<String>,
    pub health_check_node_port: Option<i32>,
}

#[derive(Clone, Debug, Default, PartialEq, Eq, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct ServicePort {
    pub name: Option<String>,
    pub port: i32,
    pub protocol: Option<String>,
    pub node_port: Option<i32>,
}

#[derive(Clone, Debug, Default, PartialEq, Eq, Deserialize)]
pub struct SessionAffinityConfig {
    #[serde(rename = "clientIP")]
    pub client_ip: Option<ClientIpConfig>,
}

#[derive(Clone, Debug, Default, PartialEq, Eq, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct ClientIpConfig {
    pub timeout_seconds: Option<i32>,
}

#[derive(Clone, Debug, Default, PartialEq, Eq, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct ServiceStatus {
    pub load_balancer: Option<LoadBalancerStatus>,
}

#[derive(Clone, Debug, Default, PartialEq, Eq, Deserialize)]
pub struct LoadBalancerStatus {
    pub ingress: Option<Vec<LoadBalancerIngress>>,
}

#[derive(Clone, Debug, Default, PartialEq, Eq, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct LoadBalancerIngress {
    pub ip: Option<String>,
    pub ip_mode: Option<String>,
}

#[derive(Clone, Debug, Default, PartialEq, Eq, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct EndpointSlice {
    #[serde(default)]
    pub metadata: Meta,
    #[serde(default)]
    pub address_type: String,
    #[serde(default, deserialize_with = "null_as_empty")]
    pub endpoints: Vec<Endpoint>,
    pub ports: Option<Vec<EndpointPort>>,
}

#[derive(Clone, Debug, Default, PartialEq, Eq, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct Endpoint {
    #[serde(default, deserialize_with = "null_as_empty")]
    pub addresses: Vec<String>,
    pub conditions: Option<EndpointConditions>,
    pub node_name: Option<String>,
    pub hints: Option<EndpointHints>,
}

#[derive(Clone, Debug, Default, PartialEq, Eq, Deserialize)]
pub struct EndpointConditions {
    pub ready: Option<bool>,
    pub serving: Option<bool>,
    pub terminating: Option<bool>,
}

#[derive(Clone, Debug, Default, PartialEq, Eq, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct EndpointHints {
    pub for_zones: Option<Vec<ForZone>>,
    pub for_nodes: Option<Vec<ForNode>>,
}

#[derive(Clone, Debug, Default, PartialEq, Eq, Deserialize)]
pub struct ForZone {
    pub name: String,
}

#[derive(Clone, Debug, Default, PartialEq, Eq, Deserialize)]
pub struct ForNode {
    pub name: String,
}

#[derive(Clone, Debug, Default, PartialEq, Eq, Deserialize)]
pub struct EndpointPort {
    pub name: Option<String>,
    pub port: Option<i32>,
    pub protocol: Option<String>,
}

impl Service {
    /// Gives back the spare room of the decoder's vectors (they grow by
    /// doubling: two endpoints sit in room for four).
    pub fn shrink_to_fit(&mut self) {
        if let Some(spec) = &mut self.spec {
            for v in [
                &mut spec.cluster_ips,
                &mut spec.external_ips,
                &mut spec.load_balancer_source_ranges,
            ]
            .into_iter()
            .flatten()
            {
                v.shrink_to_fit();
            }
            if let Some(p) = &mut spec.ports {
                p.shrink_to_fit();
            }
        }
        if let Some(i) = self
            .status
            .as_mut()
            .and_then(|s| s.load_balancer.as_mut())
            .and_then(|l| l.ingress.as_mut())
        {
            i.shrink_to_fit();
        }
    }
}

impl EndpointSlice {
    /// As `Service::shrink_to_fit`.
    pub fn shrink_to_fit(&mut self) {
        self.endpoints.shrink_to_fit();
        for e in &mut self.endpoints {
            e.addresses.shrink_to_fit();
        }
        if let Some(p) = &mut self.ports {
            p.shrink_to_fit();
        }
    }
}

/// The types the watches decode, with kube's identity of each.
pub trait Kind: for<'de> Deserialize<'de> + Clone + std::fmt::Debug + Send + 'static {
    const KIND: &'static str;
    const GROUP: &'static str;
    const VERSION: &'static str;
    const PLURAL: &'static str;
    fn meta_mut(&mut self) -> &mut Meta;
}

impl Kind for Service {
    const KIND: &'static str = "Service";
    const GROUP: &'static str = "";
    const VERSION: &'static str = "v1";
    const PLURAL: &'static str = "services";
    fn meta_mut(&mut self) -> &mut Meta {
        &mut self.metadata
    }
}

impl Kind for EndpointSlice {
    const KIND: &'static str = "EndpointSlice";
    const GROUP: &'static str = "discovery.k8s.io";
    const VERSION: &'static str = "v1";
    const PLURAL: &'static str = "endpointslices";
    fn meta_mut(&mut self) -> &mut Meta {
        &mut self.metadata
    }
}

/// An object as a watch delivers it: the slim object and the bit of
/// `ObjectMeta` kube's watcher reads (name, namespace, resourceVersion).
#[derive(Clone, Debug)]
pub struct Watched<T> {
    pub object: T,
    meta: ObjectMeta,
}

impl<T: Kind> Watched<T> {
    pub fn new(mut object: T) -> Self {
        let m = object.meta_mut();
        let meta = ObjectMeta {
            name: m.name.clone(),
            namespace: m.namespace.clone(),
            // The watcher's; the store does not keep it.
            resource_version: m.resource_version.take(),
            ..Default::default()
        };
        Self { object, meta }
    }
}

impl<'de, T: Kind> Deserialize<'de> for Watched<T> {
    fn deserialize<D: Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        T::deserialize(d).map(Self::new)
    }
}

impl<T: Kind> kube::Resource for Watched<T> {
    type DynamicType = ();
    type Scope = kube::core::NamespaceResourceScope;
    fn kind(_: &()) -> Cow<'_, str> {
        T::KIND.into()
    }
    fn group(_: &()) -> Cow<'_, str> {
        T::GROUP.into()
    }
    fn version(_: &()) -> Cow<'_, str> {
        T::VERSION.into()
    }
    fn plural(_: &()) -> Cow<'_, str> {
        T::PLURAL.into()
    }
    fn meta(&self) -> &ObjectMeta {
        &self.meta
    }
    fn meta_mut(&mut self) -> &mut ObjectMeta {
        &mut self.meta
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// What the apiserver sends for a Service (kubectl get -o json, trimmed
    /// of nothing): managedFields, selector, other labels and annotations
    /// are dropped while decoding; what the translation reads stays.
    #[test]
    fn a_service_keeps_only_what_the_translation_reads() {
        let json = r#"{"apiVersion":"v1","kind":"Service","metadata":{
            "name":"web","namespace":"shop","uid":"0b1c","resourceVersion":"4711",
            "creationTimestamp":"2026-12-01T10:00:00Z",
            "labels":{"app":"web","service.kubernetes.io/headless":""},
            "annotations":{"kubectl.kubernetes.io/last-applied-configuration":"{\"huge\":1}",
                           "lb.dev/algorithm":"maglev","lb.dev/forwarding-mode":"dsr"},
            "managedFields":[{"manager":"kubectl","operation":"Update","fieldsType":"FieldsV1",
                              "fieldsV1":{"f:spec":{"f:ports":{}}}}]},
          "spec":{"type":"LoadBalancer","clusterIP":"10.96.0.10","clusterIPs":["10.96.0.10"],
            "selector":{"app":"web"},"ipFamilies":["IPv4"],"ipFamilyPolicy":"SingleStack",
            "ports":[{"name":"http","port":80,"protocol":"TCP","targetPort":8080,"nodePort":30080}],
            "sessionAffinity":"ClientIP","sessionAffinityConfig":{"clientIP":{"timeoutSeconds":60}},
            "externalTrafficPolicy":"Local","healthCheckNodePort":31000},
          "status":{"loadBalancer":{"ingress":[{"ip":"203.0.113.7","ipMode":"VIP"}]},
            "conditions":[{"type":"x","status":"True"}]}}"#;
        let w: Watched<Service> = serde_json::from_str(json).unwrap();
        use kube::Resource as _;
        assert_eq!(w.meta().resource_version.as_deref(), Some("4711"));
        assert_eq!(w.meta().name.as_deref(), Some("web"));
        let s = w.object;
        assert_eq!(
            s.metadata.labels,
            Some(
                [(LABEL_HEADLESS.to_string(), String::new())]
                    .into_iter()
                    .collect()
            )
        );
        assert_eq!(
            s.metadata.annotations,
            Some(
                [
                    (ANNOTATION_ALGORITHM.to_string(), "maglev".to_string()),
                    (ANNOTATION_FORWARDING_MODE.to_string(), "dsr".to_string())
                ]
                .into_iter()
                .collect()
            )
        );
        let spec = s.spec.unwrap();
        assert_eq!(spec.ports.unwrap()[0].node_port, Some(30080));
        assert_eq!(
            spec.session_affinity_config
                .unwrap()
                .client_ip
                .unwrap()
                .timeout_seconds,
            Some(60)
        );
        assert_eq!(spec.health_check_node_port, Some(31000));
        let ingress = s.status.unwrap().load_balancer.unwrap().ingress.unwrap();
        assert_eq!(ingress[0].ip.as_deref(), Some("203.0.113.7"));
    }

    /// What the apiserver sends for a slice whose endpoints are all gone:
    /// `null` lists decode as empty (the update that empties a slice must
    /// not be lost, nor a list containing one fail).
    #[test]
    fn a_slice_with_null_endpoints_and_ports_decodes_as_empty() {
        let s: EndpointSlice = serde_json::from_str(
            r#"{"metadata":{"name":"web-abc","namespace":"default",
                "labels":{"kubernetes.io/service-name":"web"}},
                "addressType":"IPv4","endpoints":null,"ports":null}"#,
        )
        .unwrap();
        assert!(s.endpoints.is_empty());
        assert_eq!(s.ports, None);
        let e: Endpoint = serde_json::from_str(r#"{"addresses":null}"#).unwrap();
        assert!(e.addresses.is_empty());
    }

    #[test]
    fn unknown_labels_and_annotations_leave_no_map_behind() {
        let s: Service = serde_json::from_str(
            r#"{"metadata":{"name":"a","labels":{"app":"x"},"annotations":null}}"#,
        )
        .unwrap();
        assert_eq!(s.metadata.labels, None);
        assert_eq!(s.metadata.annotations, None);
    }
}
