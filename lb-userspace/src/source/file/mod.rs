//! Standalone mode: the model comes from a YAML services file, re-read when
//! it changes (inotify on its directory, so editors that replace the file by
//! rename are seen too) or on SIGHUP.
use std::path::{Path, PathBuf};

use anyhow::Context as _;
use notify::{EventKind, RecursiveMode, Watcher as _};
use tokio::sync::mpsc;

pub mod cache;
pub mod parse;

use self::{cache::FileCache, parse as services_file};
use crate::{
    model::{Algorithm, Model},
    source::nodeports::{NodePortAddr, NodePortAddresses},
    sys,
};

#[derive(Debug, thiserror::Error)]
pub enum LoadError {
    #[error("cannot read services file {path}: {source}")]
    Read {
        path: PathBuf,
        #[source]
        source: std::io::Error,
    },
    #[error("services file {path}: {source}")]
    Invalid {
        path: PathBuf,
        #[source]
        source: services_file::FileError,
    },
}

/// What the services file is read against on this node: NodePorts on the
/// devices' addresses, filtered by --nodeport-addresses (`primary`: the
/// first IPv4 and the first global IPv6 address of the devices, in their
/// order), and the default algorithm.
pub fn node_context(
    flags: &[NodePortAddr],
    devices: &[String],
    default_algorithm: Algorithm,
) -> anyhow::Result<services_file::FileContext> {
    let mut addresses = Vec::new();
    for dev in devices {
        addresses.extend(sys::netdev::ipv4_address(dev)?.map(std::net::IpAddr::V4));
        addresses.extend(sys::netdev::ipv6_address(dev)?.map(std::net::IpAddr::V6));
    }
    NodePortAddresses::check_flags(flags).map_err(anyhow::Error::msg)?;
    let nodeports = NodePortAddresses::from_flags(flags, addresses.clone());
    Ok(services_file::FileContext {
        nodeport_addresses: nodeports.pick(&addresses, &[]),
        default_algorithm,
    })
}

pub fn load(path: &Path, ctx: &services_file::FileContext) -> Result<Model, LoadError> {
    load_cached(path, ctx, &mut FileCache::default())
}

/// `load`, reusing from `cache` the services whose text did not change
/// since the last read (see `cache`).
pub fn load_cached(
    path: &Path,
    ctx: &services_file::FileContext,
    cache: &mut FileCache,
) -> Result<Model, LoadError> {
    let text = std::fs::read_to_string(path).map_err(|source| LoadError::Read {
        path: path.to_path_buf(),
        source,
    })?;
    cache
        .parse(&text, ctx)
        .map_err(|source| LoadError::Invalid {
            path: path.to_path_buf(),
            source,
        })
}

/// Sends `()` whenever the file may have changed. Keep the returned watcher alive.
pub fn watch(path: &Path) -> anyhow::Result<(notify::RecommendedWatcher, mpsc::Receiver<()>)> {
    let (tx, rx) = mpsc::channel(16);
    let file_name = path
        .file_name()
        .context("services file path has no file name")?
        .to_owned();
    let dir = match path.parent() {
        Some(p) if !p.as_os_str().is_empty() => p.to_path_buf(),
        _ => PathBuf::from("."),
    };
    let mut watcher = notify::recommended_watcher(move |event: notify::Result<notify::Event>| {
        let Ok(event) = event else { return };
        let relevant = matches!(
            event.kind,
            EventKind::Create(_) | EventKind::Modify(_) | EventKind::Remove(_)
        ) && event
            .paths
            .iter()
            .any(|p| p.file_name() == Some(file_name.as_os_str()));
        if relevant {
            // A full channel already holds a pending reload: dropping this one loses nothing.
            let _ = tx.try_send(());
        }
    })?;
    watcher
        .watch(&dir, RecursiveMode::NonRecursive)
        .with_context(|| format!("watching {}", dir.display()))?;
    Ok((watcher, rx))
}

/// Waits until the file has stopped changing: its size and modification
/// time the same 10 ms apart (at most a second). A rename, what most tools
/// do, settles at once; an editor that writes in place does it in several
/// steps, and a half-written file can parse (cut at a service) and would
/// delete the services not yet written.
async fn settle(path: &Path) {
    let stamp = |p: &Path| {
        std::fs::metadata(p)
            .ok()
            .map(|m| (m.len(), m.modified().ok()))
    };
    let mut last = stamp(path);
    for _ in 0..100 {
        tokio::time::sleep(std::time::Duration::from_millis(10)).await;
        let now = stamp(path);
        if now == last {
            return;
        }
        last = now;
    }
}

/// The file source as a task: a full model at start and after every change
/// (inotify) or `reload` request (SIGHUP); an error event when the file
/// cannot be read or is invalid.
pub async fn run(
    path: PathBuf,
    ctx: services_file::FileContext,
    tx: mpsc::Sender<super::SourceEvent>,
    mut reload: mpsc::Receiver<()>,
) {
    use super::SourceEvent;
    let (_watcher, mut changes) = match watch(&path) {
        Ok(w) => w,
        Err(e) => {
            let _ = tx
                .send(SourceEvent::Error {
                    source: "file",
                    reason: "watch-failed",
                    message: format!("{e:#}"),
                })
                .await;
            return;
        }
    };
    let mut observed = std::time::Instant::now();
    let mut cache = FileCache::default();
    loop {
        let event = match load_cached(&path, &ctx, &mut cache) {
            Ok(model) => SourceEvent::Full {
                model,
                observed,
                triggers: Vec::new(),
            },
            Err(e) => SourceEvent::Error {
                source: "file",
                reason: match e {
                    LoadError::Read { .. } => "unreadable",
                    LoadError::Invalid { .. } => "invalid",
                },
                message: e.to_string(),
            },
        };
        if tx.send(event).await.is_err() {
            return;
        }
        tokio::select! {
            Some(()) = changes.recv() => {}
            Some(()) = reload.recv() => {}
            else => return,
        }
        observed = std::time::Instant::now();
        settle(&path).await;
        while changes.try_recv().is_ok() {}
    }
}
