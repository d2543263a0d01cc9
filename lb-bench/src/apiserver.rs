//! Talking to the test bed's apiserver from the bench: it listens on the
//! control plane's loopback, so every call runs on a thread inside that
//! network namespace; and the selectorless Services with one EndpointSlice
//! each that the Kubernetes parts create by the thousand.
use std::{future::Future, net::Ipv4Addr};

use k8s_openapi::api::{core::v1::Service, discovery::v1::EndpointSlice};
use kube::{api::PostParams, Api, Client};

/// Runs the future `make` returns on a thread of its own inside network
/// namespace `netns` (a current-thread runtime), and waits for its result.
pub fn in_netns<T, F>(netns: &str, make: impl FnOnce() -> F + Send + 'static) -> T
where
    T: Send + 'static,
    F: Future<Output = T>,
{
    let netns = netns.to_string();
    std::thread::spawn(move || {
        lb_testkit::netns::enter(&netns).expect("entering the control plane's namespace");
        tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build()
            .unwrap()
            .block_on(make())
    })
    .join()
    .expect("the apiserver thread panicked")
}

pub async fn client(kubeconfig: &std::path::Path) -> Client {
    let kc = kube::config::Kubeconfig::read_from(kubeconfig).unwrap();
    let cfg = kube::Config::from_custom_kubeconfig(kc, &Default::default())
        .await
        .unwrap();
    Client::try_from(cfg).unwrap()
}

pub fn json<T: serde::de::DeserializeOwned>(v: serde_json::Value) -> T {
    serde_json::from_value(v).unwrap()
}

/// A selectorless Service to be created with `selectorless`.
pub struct Selectorless<'a> {
    pub name: &'a str,
    /// The Service's labels (null: none).
    pub labels: serde_json::Value,
    /// Its one TCP port: name, and the endpoints' port (the Service's is 80).
    pub port_name: &'a str,
    pub target_port: u16,
    /// Its slice's endpoints, all ready, on node `node` where given.
    pub endpoints: &'a [Ipv4Addr],
    pub node: Option<&'a str>,
}

/// Creates the Service and its one EndpointSlice (`<name>-1`).
pub async fn selectorless(svcs: &Api<Service>, slices: &Api<EndpointSlice>, s: Selectorless<'_>) {
    let pp = PostParams::default();
    svcs.create(
        &pp,
        &json(serde_json::json!({
            "metadata": {"name": s.name, "labels": s.labels},
            "spec": {"ports": [{"name": s.port_name, "port": 80, "targetPort": s.target_port}]}
        })),
    )
    .await
    .unwrap();
    let endpoints: Vec<_> = s
        .endpoints
        .iter()
        .map(|ip| {
            let mut e =
                serde_json::json!({"addresses": [ip.to_string()], "conditions": {"ready": true}});
            if let Some(node) = s.node {
                e["nodeName"] = node.into();
            }
            e
        })
        .collect();
    slices
        .create(
            &pp,
            &json(serde_json::json!({
                "metadata": {"name": format!("{}-1", s.name), "labels": {"kubernetes.io/service-name": s.name}},
                "addressType": "IPv4",
                "ports": [{"name": s.port_name, "port": s.target_port, "protocol": "TCP"}],
                "endpoints": endpoints
            })),
        )
        .await
        .unwrap();
}
