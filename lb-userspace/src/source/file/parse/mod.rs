//! The services file of standalone mode: a YAML list of services shaped like
//! Kubernetes Services, with their backends inline.
//!
//! ```yaml
//! services:
//!   - name: web
//!     namespace: default          # optional, "default"
//!     clusterIPs: [10.96.0.10]
//!     ports:
//!       - name: http
//!         port: 80
//!         protocol: TCP           # TCP (default) or UDP
//!         targetPort: 8080        # default: port
//!     backends:
//!       - address: 10.244.1.2
//!       - address: 10.244.1.3
//!         state: terminating      # active (default), terminating, maintenance
//! ```
//!
//! NodePort and LoadBalancer services (`type`, `ports[].nodePort`,
//! `loadBalancerIPs`, `externalTrafficPolicy`), `algorithm: maglev` (with
//! its own `maglevTableSize`, else the agent's) and backend `weight`s are
//! supported too; NodePorts need the node's addresses,
//! which the agent takes from its `--devices`.
//!
//! Errors name the field (`services[1].ports[0].port`) and say how to fix it.
//! Parsing is all-or-nothing: an invalid file never becomes a model, so the
//! maps keep the last good state.
use std::{fmt, net::IpAddr};

mod service;
mod spec;

pub(crate) use self::service::convert;
use self::spec::err;
pub use self::spec::{BackendSpec, FileContext, FileError, PortSpec, ServiceSpec, ServicesFile};
use crate::model::{
    claims::{frontend_id, FrontendClaims},
    Model, Service, ServiceName,
};

/// Parses and validates a services file (no NodePorts: no node addresses).
pub fn parse(text: &str) -> Result<Model, FileError> {
    parse_with(text, &FileContext::default())
}

/// serde-saphyr's default budget (250 000 nodes, 1 000 000 events) guards
/// against hostile documents and stops a services file at about 10 000
/// services. The file is the node's own configuration, written by root:
/// room for about a million services, keeping the alias limits (the
/// "billion laughs" guard) as they are.
pub(crate) fn parse_options() -> serde_saphyr::Options {
    serde_saphyr::options! {
        budget: serde_saphyr::budget! {
            max_nodes: 40_000_000,
            max_events: 100_000_000,
        },
    }
}

pub fn parse_with(text: &str, ctx: &FileContext) -> Result<Model, FileError> {
    // Each service is checked and turned into the model as soon as it is
    // read, so the parser's per-service records are freed (and their memory
    // reused) one at a time: the whole file parsed first held about 1 KiB per
    // service at once and left the model scattered through it (see
    // `crate::sys::heap`).
    let mut converter = Converter::new(ctx);
    let parsed =
        serde_saphyr::with_deserializer_from_str_with_options(text, parse_options(), |d| {
            serde::de::DeserializeSeed::deserialize(StreamedFileSeed(&mut converter), d)
        });
    match parsed {
        Ok(_) => converter.finish(),
        // A service refused by the converter aborts the parse; its error
        // names the field, which the parser's message would not.
        Err(e) => Err(converter
            .error
            .take()
            .unwrap_or_else(|| err("", format!("not a valid services file: {e}")))),
    }
}

pub fn to_model(file: &ServicesFile, ctx: &FileContext) -> Result<Model, FileError> {
    let mut converter = Converter::new(ctx);
    for spec in &file.services {
        converter.add(spec)?;
    }
    converter.finish()
}

/// Turns service specs into the model one at a time, with the checks that
/// span services (one owner per frontend, one locality per backend address).
pub(crate) struct Converter<'a> {
    ctx: &'a FileContext,
    model: Model,
    /// Specs seen so far (the index of the next one).
    index: usize,
    /// Each frontend's services (a second one refuses the file).
    frontends: FrontendClaims,
    /// Where each service was defined, to name the first of two claimants.
    index_of: crate::collections::HashMap<ServiceName, usize>,
    /// backend address → (local, service index, backend index) where first set.
    locality: crate::collections::HashMap<IpAddr, (bool, usize, usize)>,
    /// The error that stopped a streamed parse.
    error: Option<FileError>,
}

impl<'a> Converter<'a> {
    pub(crate) fn new(ctx: &'a FileContext) -> Self {
        Self {
            ctx,
            model: Model::default(),
            index: 0,
            frontends: FrontendClaims::default(),
            index_of: Default::default(),
            locality: Default::default(),
            error: None,
        }
    }

    pub(crate) fn add(&mut self, spec: &ServiceSpec) -> Result<(), FileError> {
        self.add_remembered(spec, &mut None)
    }

    /// `add`, with the service as converted before (`converted`: the
    /// conversion depends on the spec and the context only); a conversion
    /// made here is left there for next time.
    pub(crate) fn add_remembered(
        &mut self,
        spec: &ServiceSpec,
        converted: &mut Option<Service>,
    ) -> Result<(), FileError> {
        let i = self.index;
        self.index += 1;
        let at = format!("services[{i}]");
        for (j, b) in spec.backends.iter().enumerate() {
            let Ok(address) = b.address.trim().parse::<IpAddr>() else {
                continue;
            };
            match self.locality.get(&address) {
                Some((local, fi, fj)) if *local != b.local => {
                    return Err(err(
                        format!("{at}.backends[{j}].local"),
                        format!(
                            "{address} is local: {local} in services[{fi}].backends[{fj}]; a backend is on this node or not for every service, make them agree"
                        ),
                    ))
                }
                Some(_) => {}
                None => {
                    self.locality.insert(address, (b.local, i, j));
                }
            }
        }
        let name = ServiceName::new(&spec.namespace, &spec.name);
        let service = match converted {
            Some(s) => s.clone(),
            None => {
                let service = convert(&at, spec, self.ctx)?;
                *converted = Some(service.clone());
                service
            }
        };
        let mut own = crate::collections::HashSet::default();
        for fe in &service.frontends {
            let id = frontend_id(fe);
            if !own.insert(id) {
                return Err(err(
                    at.clone(),
                    format!(
                        "{}:{}/{} is a frontend of this service twice (a node address among externalIPs or loadBalancerIPs on its NodePort?); give each its own address or port",
                        fe.address,
                        fe.port,
                        fe.protocol.as_str()
                    ),
                ));
            }
            self.frontends.claim(id, &name);
            if let Some(prev) = self.frontends.rival(&id, &name) {
                let pi = self.index_of.get(prev).copied().unwrap_or_default();
                return Err(err(
                    at.clone(),
                    format!(
                        "{}:{}/{} is already a frontend of services[{pi}] ({prev}); give each service its own address or port",
                        fe.address,
                        fe.port,
                        fe.protocol.as_str()
                    ),
                ));
            }
        }
        self.index_of.entry(name.clone()).or_insert(i);
        if self.model.services.insert(name.clone(), service).is_some() {
            return Err(err(
                format!("{at}.name"),
                format!("service {name} is defined twice; rename one or merge them"),
            ));
        }
        Ok(())
    }

    pub(crate) fn finish(self) -> Result<Model, FileError> {
        Ok(self.model)
    }
}

/// The top level of a services file, read with each service handed to a
/// `Converter` as it is parsed (same fields and errors as `ServicesFile`).
struct StreamedFile;
struct StreamedFileSeed<'c, 'a>(&'c mut Converter<'a>);
struct StreamedServices<'c, 'a>(&'c mut Converter<'a>);

impl<'de> serde::de::DeserializeSeed<'de> for StreamedFileSeed<'_, '_> {
    type Value = StreamedFile;
    fn deserialize<D: serde::Deserializer<'de>>(self, d: D) -> Result<StreamedFile, D::Error> {
        d.deserialize_map(self)
    }
}

impl<'de> serde::de::Visitor<'de> for StreamedFileSeed<'_, '_> {
    type Value = StreamedFile;
    fn expecting(&self, f: &mut fmt::Formatter) -> fmt::Result {
        f.write_str("a services file (a mapping with `services`)")
    }
    fn visit_unit<E: serde::de::Error>(self) -> Result<StreamedFile, E> {
        // An empty document: no services.
        Ok(StreamedFile)
    }
    fn visit_map<A: serde::de::MapAccess<'de>>(self, mut map: A) -> Result<StreamedFile, A::Error> {
        let mut seen = false;
        while let Some(key) = map.next_key::<String>()? {
            match key.as_str() {
                "services" if seen => return Err(serde::de::Error::duplicate_field("services")),
                "services" => {
                    seen = true;
                    map.next_value_seed(StreamedServices(&mut *self.0))?;
                }
                other => return Err(serde::de::Error::unknown_field(other, &["services"])),
            }
        }
        Ok(StreamedFile)
    }
}

impl<'de> serde::de::DeserializeSeed<'de> for StreamedServices<'_, '_> {
    type Value = ();
    fn deserialize<D: serde::Deserializer<'de>>(self, d: D) -> Result<(), D::Error> {
        d.deserialize_any(self)
    }
}

impl<'de> serde::de::Visitor<'de> for StreamedServices<'_, '_> {
    type Value = ();
    fn expecting(&self, f: &mut fmt::Formatter) -> fmt::Result {
        f.write_str("a list of services")
    }
    fn visit_unit<E: serde::de::Error>(self) -> Result<(), E> {
        // `services:` with nothing after it.
        Ok(())
    }
    fn visit_seq<A: serde::de::SeqAccess<'de>>(self, mut seq: A) -> Result<(), A::Error> {
        while let Some(spec) = seq.next_element::<ServiceSpec>()? {
            if let Err(e) = self.0.add(&spec) {
                let message = e.to_string();
                self.0.error = Some(e);
                return Err(serde::de::Error::custom(message));
            }
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests;
