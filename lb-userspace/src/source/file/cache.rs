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
use crate::collections::HashMap;

use super::parse::{self as file, Converter, FileContext, FileError, ServiceSpec, ServicesFile};
use crate::model::{Model, Service};

/// One service as read before: its spec, and its conversion once made.
struct Piece {
    spec: ServiceSpec,
    service: Option<Service>,
}

/// Parsed services by their text, kept from one read to the next.
#[derive(Default)]
pub struct FileCache {
    pieces: HashMap<String, Piece>,
    /// The context the conversions were made in (NodePort addresses, the
    /// default algorithm); another one converts again.
    ctx: Option<FileContext>,
    /// Pieces parsed (not found in the cache) by the last `parse`.
    pub last_parsed: usize,
}

impl FileCache {
    /// `file::parse_with`, reusing the services of earlier reads whose text
    /// did not change.
    pub fn parse(&mut self, text: &str, ctx: &FileContext) -> Result<Model, FileError> {
        self.last_parsed = 0;
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
    // The whole parse's limits, so a piece is refused exactly when it would be there.
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
