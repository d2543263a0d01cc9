//! Kubernetes mode: Services, EndpointSlices and this node's Node from the
//! apiserver, translated with kube-proxy's semantics into the model.
//!
//! * `watch`: the watches and their debounce;
//! * `slim`: the objects as decoded from the wire, with only what the
//!   translation reads (no managedFields, selectors, other annotations);
//! * `translate`: each object's record (parsed once, kept by the store) and
//!   the translation of a service's record and its slices' into the model;
//! * `store`: the records, complete lists before any output, frontend
//!   claims, and what changed since the last output;
//! * `port_names`: one shared copy of each port name the records hold;
//! * `api_traffic`: lists, watch requests and bookmarks, counted on the wire.
pub mod api_traffic;
pub mod port_names;
pub mod slim;
pub mod store;
pub mod translate;
pub mod watch;
