//! Re-reading a services file after an edit without parsing what did not
//! change. The file is cut into its services (the items of the `services:`
//! list), each piece is parsed on its own and remembered by its text; an
//! edit of one service parses one piece. The checks between services (one
//! owner per frontend, one locality per backend address) and the conversion
//! to the model run over all of them as in a whole parse, in file order, so
//! the result is the same model; an error is found again by a whole parse,
//! so it reads the same too.
//!
//! Only the plain block layout is cut, the layout this project documents
//! and generates: `services:` on a line of its own, then `- ` items at one
//! indentation with their lines indented deeper. Anything else (flow style,
//! anchors and aliases that tie pieces together, tabs, more documents,
//! another top-level key) is parsed whole, as before.
//!
//! `read` goes one step further for the agent: after a good read it keeps
//! what the file's services claim (names, frontends, backend localities),
//! so an edit is checked against the rest by looking up only what the
//! edited services claim, and the answer is the change (the services
//! edited, added and gone) instead of a whole model for the reconciler to
//! compare with its own, service by service. Whatever the quick check
//! refuses is read whole again, so an error reads exactly as before.
use std::{collections::BTreeMap, net::IpAddr};

use crate::collections::{HashMap, HashSet};

use super::parse::{self as file, Converter, FileContext, FileError, ServiceSpec, ServicesFile};
use crate::model::{
    claims::{frontend_id, FrontendClaims},
    Model, Service, ServiceName,
};

/// One service as read before: its spec, and its conversion once made.
struct Piece {
    spec: ServiceSpec,
    service: Option<Service>,
    /// The `read` that last found this piece in the file (`FileCache::epoch`).
    seen: u64,
}

/// What `read` found.
#[derive(Debug, PartialEq)]
pub enum Read {
    /// Every service of the file (the first read, another layout, after a
    /// refused file or another context).
    Whole(Model),
    /// What changed since the last good read: each service edited or
    /// added, with its new version, and each one gone, with `None`.
    Changes(Vec<(ServiceName, Option<Service>)>),
}

/// What the services of a good read claim, the things no two services may
/// share (the whole parse's checks between services, `parse::Converter`).
#[derive(Default)]
struct Claims {
    names: HashSet<ServiceName>,
    /// Each frontend's services (a file is refused while one has two).
    frontends: FrontendClaims,
    /// Backend address → (entries saying local, entries saying not).
    locality: HashMap<IpAddr, (u32, u32)>,
}

impl Claims {
    /// Adds a service's claims; false if one clashes with another service's
    /// (or its own): the file is refused, and a whole parse says why.
    fn add(&mut self, spec: &ServiceSpec, service: &Service) -> bool {
        let name = ServiceName::new(&spec.namespace, &spec.name);
        let mut ok = self.names.insert(name.clone());
        let mut own = HashSet::default();
        for fe in &service.frontends {
            let id = frontend_id(fe);
            // Twice in one service, or another service's: refused.
            ok &= own.insert(id);
            self.frontends.claim(id, &name);
            ok &= self.frontends.rival(&id, &name).is_none();
        }
        for b in &spec.backends {
            let Ok(address) = b.address.trim().parse::<IpAddr>() else {
                continue;
            };
            let (local, remote) = self.locality.entry(address).or_default();
            if b.local {
                *local += 1;
            } else {
                *remote += 1;
            }
            ok &= *local == 0 || *remote == 0;
        }
        ok
    }

    /// Takes back what `add` added for this service (which was good).
    fn remove(&mut self, spec: &ServiceSpec, service: &Service) {
        let name = ServiceName::new(&spec.namespace, &spec.name);
        self.names.remove(&name);
        for fe in &service.frontends {
            self.frontends.release(frontend_id(fe), &name);
        }
        for b in &spec.backends {
            let Ok(address) = b.address.trim().parse::<IpAddr>() else {
                continue;
            };
            if let Some(counts) = self.locality.get_mut(&address) {
                let count = if b.local {
                    &mut counts.0
                } else {
                    &mut counts.1
                };
                *count = count.saturating_sub(1);
                if *counts == (0, 0) {
                    self.locality.remove(&address);
                }
            }
        }
    }
}

/// Parsed services by their text, kept from one read to the next.
#[derive(Default)]
pub struct FileCache {
    pieces: HashMap<String, Piece>,
    /// The context the conversions were made in (NodePort addresses, the
    /// default algorithm); another one converts again.
    ctx: Option<FileContext>,
    /// Pieces parsed (not found in the cache) by the last `parse` or `read`.
    pub last_parsed: usize,
    /// The claims of the services of the last good `read`, when it was cut
    /// into pieces (None: the next `read` reads the file whole).
    claims: Option<Claims>,
    /// Counts `read`s, to tell the pieces a read found from those it did not.
    epoch: u64,
}

impl FileCache {
    /// What changed in the file since the last good read, or the whole
    /// model when that cannot be told (see `Read`). Applying the changes to
    /// the last good model gives what `file::parse_with` gives for `text`,
    /// and an error is the same as its error.
    pub fn read(&mut self, text: &str, ctx: &FileContext) -> Result<Read, FileError> {
        if self.ctx.as_ref() != Some(ctx) {
            return self.read_whole(text, ctx);
        }
        // Taken out: every way below that does not end in `Changes` reads
        // the file whole, which makes the claims again.
        let Some(mut claims) = self.claims.take() else {
            return self.read_whole(text, ctx);
        };
        let Some(pieces) = cut(text) else {
            return self.read_whole(text, ctx);
        };
        self.epoch += 1;
        self.last_parsed = 0;
        let epoch = self.epoch;
        // Pieces not in the last good read: parsed and converted on their
        // own. Anything wrong with one is for the whole parse to say.
        let mut added: Vec<(&str, ServiceSpec, Service)> = Vec::new();
        for piece in &pieces {
            match self.pieces.get_mut(*piece) {
                // The same text twice names the same service twice.
                Some(p) if p.seen == epoch => return self.read_whole(text, ctx),
                Some(p) => p.seen = epoch,
                None => {
                    self.last_parsed += 1;
                    let Some(spec) = parse_piece(piece) else {
                        return self.read_whole(text, ctx);
                    };
                    let Ok(service) = file::convert("services[?]", &spec, ctx) else {
                        return self.read_whole(text, ctx);
                    };
                    added.push((piece, spec, service));
                }
            }
        }
        let gone: Vec<String> = self
            .pieces
            .iter()
            .filter(|(_, p)| p.seen != epoch)
            .map(|(text, _)| text.clone())
            .collect();
        // Claims of the services gone are taken back before the new ones
        // are checked: a service may move its frontend to another.
        for piece in &gone {
            let p = &self.pieces[piece];
            let Some(service) = &p.service else {
                return self.read_whole(text, ctx);
            };
            claims.remove(&p.spec, service);
        }
        for (_, spec, service) in &added {
            if !claims.add(spec, service) {
                return self.read_whole(text, ctx);
            }
        }
        // Gone first: a service whose text changed is gone and added, and
        // ends up with its new version.
        let mut changes: BTreeMap<ServiceName, Option<Service>> = BTreeMap::new();
        for piece in gone {
            if let Some(p) = self.pieces.remove(&piece) {
                changes.insert(ServiceName::new(&p.spec.namespace, &p.spec.name), None);
            }
        }
        for (piece, spec, service) in added {
            changes.insert(
                ServiceName::new(&spec.namespace, &spec.name),
                Some(service.clone()),
            );
            self.pieces.insert(
                piece.to_string(),
                Piece {
                    spec,
                    service: Some(service),
                    seen: epoch,
                },
            );
        }
        self.claims = Some(claims);
        Ok(Read::Changes(changes.into_iter().collect()))
    }

    /// `parse`, then the claims of the file's services kept for the next
    /// `read` (when the file was cut into pieces). Always `Read::Whole`:
    /// for a reload asked for (SIGHUP), which resyncs everything.
    pub fn read_whole(&mut self, text: &str, ctx: &FileContext) -> Result<Read, FileError> {
        self.claims = None;
        let model = self.parse(text, ctx)?;
        // `parse` keeps exactly the pieces of a file it cut; none of one
        // it read whole.
        if !self.pieces.is_empty() {
            let mut claims = Claims::default();
            let all_good = self.pieces.values().all(|p| {
                p.service
                    .as_ref()
                    .is_some_and(|service| claims.add(&p.spec, service))
            });
            if all_good {
                self.claims = Some(claims);
            }
        }
        Ok(Read::Whole(model))
    }

    /// `file::parse_with`, reusing the services of earlier reads whose text
    /// did not change.
    pub fn parse(&mut self, text: &str, ctx: &FileContext) -> Result<Model, FileError> {
        self.last_parsed = 0;
        self.claims = None;
        if self.ctx.as_ref() != Some(ctx) {
            self.pieces.clear();
            self.ctx = Some(ctx.clone());
        }
        let Some(pieces) = cut(text) else {
            self.pieces.clear();
            return file::parse_with(text, ctx);
        };
        let mut kept: HashMap<String, Piece> =
            HashMap::with_capacity_and_hasher(pieces.len(), Default::default());
        for piece in &pieces {
            if kept.contains_key(*piece) {
                continue;
            }
            // The old key moves over with its value: no new allocation.
            let (key, value) = match self.pieces.remove_entry(*piece) {
                Some(entry) => entry,
                None => {
                    self.last_parsed += 1;
                    match parse_piece(piece) {
                        Some(spec) => (
                            piece.to_string(),
                            Piece {
                                spec,
                                service: None,
                                seen: 0,
                            },
                        ),
                        // A piece that does not parse alone: the whole
                        // file says what is wrong, with its line.
                        None => {
                            self.pieces.clear();
                            return file::parse_with(text, ctx);
                        }
                    }
                }
            };
            kept.insert(key, value);
        }
        self.pieces = kept;
        let mut converter = Converter::new(ctx);
        for piece in pieces {
            // Every piece was kept above (a miss would be a bug: read whole).
            let Some(p) = self.pieces.get_mut(piece) else {
                return file::parse_with(text, ctx);
            };
            if converter.add_remembered(&p.spec, &mut p.service).is_err() {
                // The whole parse reports it exactly as it always has.
                return file::parse_with(text, ctx);
            }
        }
        converter.finish()
    }
}

/// One service alone, as the whole file would read it.
fn parse_piece(piece: &str) -> Option<ServiceSpec> {
    let mut doc = String::with_capacity(piece.len() + 10);
    doc.push_str("services:\n");
    doc.push_str(piece);
    // The whole parse's limits on each piece. (They also apply to the
    // whole file, which a file of well over a million services exceeds;
    // read in pieces it is not refused for that.)
    let mut f: ServicesFile =
        serde_saphyr::from_str_with_options(&doc, file::parse_options()).ok()?;
    if f.services.len() != 1 {
        return None;
    }
    f.services.pop()
}

/// Whether a line is blank or only a comment.
fn blank(line: &str) -> bool {
    let t = line.trim_start_matches(' ');
    t.is_empty() || t.starts_with('#')
}

/// The services of a plain block-layout file, each as its text (the item's
/// lines, with the comments and blank lines that follow it); None when the
/// file is laid out otherwise.
fn cut(text: &str) -> Option<Vec<&str>> {
    // Anything that can tie pieces together or change how a line reads.
    if text.contains(['\t', '&', '*', '\r']) || text.contains("\n---") || text.starts_with("---") {
        return None;
    }
    let mut lines = text.split_inclusive('\n').peekable();
    let mut offset = 0;
    // Leading comments and blank lines, then `services:` alone.
    loop {
        let line = lines.next()?;
        offset += line.len();
        if blank(line) {
            continue;
        }
        let head = line.split_once(" #").map_or(line, |(head, _)| head);
        if head.trim_end() != "services:" {
            return None;
        }
        break;
    }
    let mut pieces = Vec::new();
    let mut indent: Option<usize> = None;
    let mut start: Option<usize> = None;
    for line in lines {
        let at = offset;
        offset += line.len();
        // Before the first item: part of no piece; after: of the piece
        // above (a comment changed there is that piece changed).
        if blank(line) {
            continue;
        }
        let spaces = line.len() - line.trim_start_matches(' ').len();
        let rest = &line[spaces..];
        let is_item = rest.starts_with("- ") || rest.trim_end() == "-";
        match indent {
            None if is_item => {
                indent = Some(spaces);
                start = Some(at);
            }
            None => return None,
            Some(i) if spaces == i && is_item => {
                pieces.push(&text[start?..at]);
                start = Some(at);
            }
            // The item's own lines.
            Some(i) if spaces > i => {}
            // Another key, or an item at another indentation.
            Some(_) => return None,
        }
    }
    if let Some(s) = start {
        pieces.push(&text[s..]);
    }
    Some(pieces)
}
