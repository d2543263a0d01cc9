//! Kubernetes mode: Services, EndpointSlices and this node's Node from the
//! apiserver, translated with kube-proxy's semantics into the model.
pub mod store;
pub mod translate;
pub mod watch;
