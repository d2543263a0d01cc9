//! Standalone mode: the model comes from a YAML services file, re-read when
//! it changes (inotify on its directory, so editors that replace the file by
//! rename are seen too) or on SIGHUP.
use std::path::{Path, PathBuf};

use anyhow::Context as _;
use notify::{
    event::{ModifyKind, RenameMode},
    EventKind, RecursiveMode, Watcher as _,
};
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
    // Every address of the devices, device by device (kube-proxy serves
    // NodePorts on every local address): secondary ones and those added
    // later (`Follow`) too.
    let all = sys::netdev::all_addresses()?;
    let mut addresses = Vec::new();
    for dev in devices {
        addresses.extend(all.iter().filter(|(name, _)| name == dev).map(|(_, a)| *a));
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

/// `load_cached` for the agent's watch: what changed since the last good
/// read, when the cache can tell (see `cache::Read`).
/// `whole`: the whole model, whatever changed (a reload asked for).
pub fn read_cached(
    path: &Path,
    ctx: &services_file::FileContext,
    cache: &mut FileCache,
    whole: bool,
) -> Result<cache::Read, LoadError> {
    let text = std::fs::read_to_string(path).map_err(|source| LoadError::Read {
        path: path.to_path_buf(),
        source,
    })?;
    let read = if whole {
        cache.read_whole(&text, ctx)
    } else {
        cache.read(&text, ctx)
    };
    read.map_err(|source| LoadError::Invalid {
        path: path.to_path_buf(),
        source,
    })
}

/// What the watch saw since the reader last looked.
#[derive(Clone, Default)]
pub struct Changes {
    /// Set by any change other than a file renamed into place: the file may
    /// still be being written (`settle` waits for it).
    written_in_place: std::sync::Arc<std::sync::atomic::AtomicBool>,
}

impl Changes {
    /// Whether the file was written in place since the last call (and
    /// forgets it).
    pub fn take_written_in_place(&self) -> bool {
        self.written_in_place
            .swap(false, std::sync::atomic::Ordering::AcqRel)
    }
}

/// Sends `()` whenever the file may have changed, and notes in `Changes`
/// whether it was written in place (a rename into place, what editors and
/// config management do, is complete the moment it is seen: rename(2) is
/// atomic). Keep the returned watcher alive.
pub fn watch(
    path: &Path,
) -> anyhow::Result<(notify::RecommendedWatcher, mpsc::Receiver<()>, Changes)> {
    let (tx, rx) = mpsc::channel(16);
    let changes = Changes::default();
    let seen = changes.clone();
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
        // notify reports a rename within the directory three times: From
        // (old name), To (new name) and Both (the pair). To and From carry
        // every name; Both would wake the reader a second time for one
        // rename, and the file would be read twice.
        let relevant = matches!(
            event.kind,
            EventKind::Create(_) | EventKind::Modify(_) | EventKind::Remove(_)
        ) && !matches!(
            event.kind,
            EventKind::Modify(ModifyKind::Name(RenameMode::Both))
        ) && event
            .paths
            .iter()
            .any(|p| p.file_name() == Some(file_name.as_os_str()));
        if relevant {
            // The file renamed over ours (inotify's IN_MOVED_TO, notify's To).
            let renamed_in = matches!(
                event.kind,
                EventKind::Modify(ModifyKind::Name(RenameMode::To))
            ) && event
                .paths
                .last()
                .is_some_and(|p| p.file_name() == Some(file_name.as_os_str()));
            // Metadata (IN_ATTRIB: the replaced file's link count, a chmod)
            // says nothing about the content.
            let metadata = matches!(event.kind, EventKind::Modify(ModifyKind::Metadata(_)));
            if !renamed_in && !metadata {
                // Before the wake-up, so the reader that wakes sees it.
                seen.written_in_place
                    .store(true, std::sync::atomic::Ordering::Release);
            }
            // A full channel already holds a pending reload: dropping this one loses nothing.
            let _ = tx.try_send(());
        }
    })?;
    watcher
        .watch(&dir, RecursiveMode::NonRecursive)
        .with_context(|| format!("watching {}", dir.display()))?;
    Ok((watcher, rx, changes))
}

/// Waits until the file has stopped changing: its size and modification
/// time the same 10 ms apart (at most a second). Only after a write in
/// place: an editor that writes in place does it in several steps, and a
/// half-written file can parse (cut at a service) and would delete the
/// services not yet written. A file renamed into place is read at once.
async fn settle(path: &Path, quiet: std::time::Duration) {
    let stamp = |p: &Path| {
        std::fs::metadata(p)
            .ok()
            .map(|m| (m.len(), m.modified().ok()))
    };
    let mut last = stamp(path);
    for _ in 0..100 {
        tokio::time::sleep(quiet).await;
        let now = stamp(path);
        if now == last {
            return;
        }
        last = now;
    }
}

/// This node's addresses as they change, and how to make the context
/// again from them (the devices' addresses, --nodeport-addresses).
pub struct Follow {
    pub addresses: tokio::sync::watch::Receiver<crate::agent::addresses::Addresses>,
    pub context: Box<dyn Fn() -> anyhow::Result<services_file::FileContext> + Send>,
}

/// The context after the next change of the node's addresses; None when it
/// could not be made (said) or the follower stopped (then `follow` is
/// cleared: the context stays as it is).
async fn next_context(follow: &mut Option<Follow>) -> Option<services_file::FileContext> {
    let f = follow.as_mut()?;
    if f.addresses.changed().await.is_err() {
        *follow = None;
        return None;
    }
    f.addresses.borrow_and_update();
    match (f.context)() {
        Ok(ctx) => Some(ctx),
        Err(e) => {
            tracing::warn!("this node's addresses changed, but reading them again failed: {e:#}; NodePorts stay where they were");
            None
        }
    }
}

/// The file source as a task: a full model at start and after every change
/// (inotify) or `reload` request (SIGHUP), and after a change of this
/// node's addresses that moves its NodePorts (`follow`); an error event
/// when the file cannot be read or is invalid.
pub async fn run(
    path: PathBuf,
    ctx: services_file::FileContext,
    tx: mpsc::Sender<super::SourceEvent>,
    reload: mpsc::Receiver<()>,
    follow: Option<Follow>,
) {
    run_settling(path, ctx, tx, reload, follow, SETTLE_QUIET).await;
}

/// How long a file written in place must stay unchanged to be read.
const SETTLE_QUIET: std::time::Duration = std::time::Duration::from_millis(10);

/// `run`, with the quiet time `settle` waits for (tests lengthen it, so a
/// slow test machine cannot pass it between two writes).
async fn run_settling(
    path: PathBuf,
    mut ctx: services_file::FileContext,
    tx: mpsc::Sender<super::SourceEvent>,
    mut reload: mpsc::Receiver<()>,
    mut follow: Option<Follow>,
    quiet: std::time::Duration,
) {
    use super::SourceEvent;
    let (_watcher, mut changes, seen) = match watch(&path) {
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
    // A reload asked for (SIGHUP) sends the whole model: the reconciler
    // compares it with its own and retries whatever is due.
    let mut hup = false;
    loop {
        let event = match read_cached(&path, &ctx, &mut cache, hup) {
            Ok(cache::Read::Whole(model)) => SourceEvent::Full {
                model,
                observed,
                triggers: Vec::new(),
            },
            // An edit: only the services it touched go to the reconciler
            // (none for a file written again as it was).
            Ok(cache::Read::Changes(changes)) => SourceEvent::Changes {
                changes,
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
        hup = loop {
            tokio::select! {
                Some(()) = changes.recv() => break false,
                Some(()) = reload.recv() => break true,
                new = next_context(&mut follow), if follow.is_some() => match new {
                    // The whole model again, parsed afresh: the cache's
                    // services carry the old NodePort addresses.
                    Some(new) if new != ctx => {
                        tracing::info!(addresses = ?new.nodeport_addresses, "this node's addresses changed: NodePorts follow");
                        ctx = new;
                        cache = FileCache::default();
                        break true;
                    }
                    _ => {}
                },
                // The agent stops (with `follow`, the branches above may
                // never all end).
                () = tx.closed() => return,
                else => return,
            }
        };
        observed = std::time::Instant::now();
        // SIGHUP, or a write in place: wait for the file to settle. (A
        // write that lands after this check queues another wake-up and
        // another read.)
        while changes.try_recv().is_ok() {}
        if seen.take_written_in_place() || hup {
            settle(&path, quiet).await;
            while changes.try_recv().is_ok() {}
        }
    }
}

#[cfg(test)]
mod tests {
    use std::time::Duration;

    use super::*;
    use crate::source::SourceEvent;

    /// A directory of its own under the system's temporary directory.
    fn scratch_dir(test: &str) -> PathBuf {
        let dir = std::env::temp_dir().join(format!("lb-file-{test}-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&dir);
        std::fs::create_dir_all(&dir).unwrap();
        dir
    }

    fn services(n: usize) -> String {
        let mut s = String::from("services:\n");
        for i in 0..n {
            s.push_str(&format!(
                "  - name: s{i}\n    clusterIPs: [10.96.{}.{}]\n    ports: [{{port: 80}}]\n    backends: [{{address: 10.244.0.1}}]\n",
                i / 250,
                i % 250 + 1
            ));
        }
        s
    }

    async fn next(rx: &mut mpsc::Receiver<()>) {
        tokio::time::timeout(Duration::from_secs(10), rx.recv())
            .await
            .expect("the watch saw the change")
            .expect("the watch is alive");
    }

    /// The file source on `path` with quiet time `quiet`, and its events.
    fn spawn_source(
        path: &Path,
        quiet: Duration,
    ) -> (tokio::task::JoinHandle<()>, mpsc::Receiver<SourceEvent>) {
        // The reload sender dropped: no SIGHUP ever comes.
        let (source, events, _) = spawn_source_with_reload(path, quiet);
        (source, events)
    }

    /// `spawn_source`, with the sender that asks for a reload (SIGHUP).
    fn spawn_source_with_reload(
        path: &Path,
        quiet: Duration,
    ) -> (
        tokio::task::JoinHandle<()>,
        mpsc::Receiver<SourceEvent>,
        mpsc::Sender<()>,
    ) {
        let (tx, events) = mpsc::channel(16);
        let (hup, reload) = mpsc::channel(1);
        let source = tokio::spawn(run_settling(
            path.to_path_buf(),
            Default::default(),
            tx,
            reload,
            None,
            quiet,
        ));
        (source, events, hup)
    }

    /// An edit renamed into place arrives as the change of the one service
    /// it touched; a reload asked for (SIGHUP) as the whole model.
    #[tokio::test]
    async fn an_edit_arrives_as_its_change_and_a_reload_as_the_whole_model() {
        let dir = scratch_dir("reload");
        let path = dir.join("services.yaml");
        std::fs::write(&path, services(3)).unwrap();
        let (source, mut events, hup) = spawn_source_with_reload(&path, Duration::from_millis(10));
        assert!(matches!(
            next_event(&mut events).await,
            SourceEvent::Full { .. }
        ));
        let tmp = dir.join("services.yaml.tmp");
        std::fs::write(&tmp, services(4)).unwrap();
        std::fs::rename(&tmp, &path).unwrap();
        match next_event(&mut events).await {
            SourceEvent::Changes { changes, .. } => {
                assert_eq!(changes.len(), 1, "{changes:?}");
                assert!(changes[0].1.is_some(), "s3 is added");
            }
            other => panic!("{other:?}"),
        }
        hup.send(()).await.unwrap();
        match next_event(&mut events).await {
            SourceEvent::Full { model, .. } => assert_eq!(model.services.len(), 4),
            other => panic!("{other:?}"),
        }
        source.abort();
        let _ = std::fs::remove_dir_all(&dir);
    }

    async fn next_event(events: &mut mpsc::Receiver<SourceEvent>) -> SourceEvent {
        tokio::time::timeout(Duration::from_secs(10), events.recv())
            .await
            .expect("an event")
            .expect("the source is alive")
    }

    /// The model the events so far give (a whole model replaces it,
    /// changes change it), and the number of its services; anything else
    /// fails.
    fn services_in(held: &mut Model, e: SourceEvent) -> usize {
        match e {
            SourceEvent::Full { model, .. } => *held = model,
            SourceEvent::Changes { changes, .. } => {
                for (name, service) in changes {
                    match service {
                        Some(s) => held.services.insert(name, s),
                        None => held.services.remove(&name),
                    };
                }
            }
            other => panic!("{other:?}"),
        }
        held.services.len()
    }

    /// Whether the watch flags a write in place within 10 s (its thread
    /// delivers events in its own time).
    async fn flagged(changes: &Changes) -> bool {
        for _ in 0..1000 {
            if changes.take_written_in_place() {
                return true;
            }
            tokio::time::sleep(Duration::from_millis(10)).await;
        }
        false
    }

    #[test]
    fn the_in_place_flag_is_taken_once() {
        let c = Changes::default();
        assert!(!c.take_written_in_place());
        c.written_in_place
            .store(true, std::sync::atomic::Ordering::Release);
        assert!(c.take_written_in_place());
        assert!(!c.take_written_in_place(), "taken once");
    }

    #[tokio::test]
    async fn the_watch_tells_a_file_renamed_into_place_from_a_write_in_place() {
        let dir = scratch_dir("watch");
        let path = dir.join("services.yaml");
        std::fs::write(&path, services(1)).unwrap();
        let (_watcher, mut rx, changes) = watch(&path).unwrap();
        let tmp = dir.join("services.yaml.tmp");
        std::fs::write(&tmp, services(2)).unwrap();
        std::fs::rename(&tmp, &path).unwrap();
        next(&mut rx).await;
        // Time for whatever else the rename brings (the paired event): none
        // of it may count as a write.
        tokio::time::sleep(Duration::from_millis(100)).await;
        assert!(!changes.take_written_in_place(), "a rename is complete");
        assert!(rx.try_recv().is_err(), "one rename, one wake-up");
        std::fs::write(&path, services(3)).unwrap();
        assert!(flagged(&changes).await, "a write in place is not");
        let _ = std::fs::remove_dir_all(&dir);
    }

    /// With a quiet time of a minute, only a read that skips the settle
    /// arrives within the test's 10 s.
    #[tokio::test]
    async fn a_file_renamed_into_place_is_read_without_waiting_to_settle() {
        let dir = scratch_dir("rename");
        let path = dir.join("services.yaml");
        std::fs::write(&path, services(1)).unwrap();
        let (source, mut events) = spawn_source(&path, Duration::from_secs(60));
        let first = tokio::time::timeout(Duration::from_secs(10), events.recv()).await;
        let mut held = Model::default();
        assert_eq!(services_in(&mut held, first.unwrap().unwrap()), 1);
        let tmp = dir.join("services.yaml.tmp");
        std::fs::write(&tmp, services(7)).unwrap();
        std::fs::rename(&tmp, &path).unwrap();
        let read = tokio::time::timeout(Duration::from_secs(10), events.recv())
            .await
            .expect("read at once, not after the quiet time")
            .unwrap();
        assert_eq!(services_in(&mut held, read), 7);
        source.abort();
        let _ = std::fs::remove_dir_all(&dir);
    }

    /// An editor that writes in place in two steps: the first half alone is
    /// a valid file of fewer services, which must never be applied (it would
    /// delete the rest). The steps are 50 ms apart and the quiet time 500 ms,
    /// the agent's 10 ms scaled up so that a slow machine cannot pass it
    /// between them (the agent's own covers steps a few ms apart).
    #[tokio::test]
    async fn a_file_written_in_place_in_two_steps_is_read_once_complete() {
        use std::io::Write as _;
        let dir = scratch_dir("settle");
        let path = dir.join("services.yaml");
        std::fs::write(&path, services(4)).unwrap();
        let (source, mut events) = spawn_source(&path, Duration::from_millis(500));
        let first = tokio::time::timeout(Duration::from_secs(10), events.recv()).await;
        let mut held = Model::default();
        assert_eq!(services_in(&mut held, first.unwrap().unwrap()), 4);
        let whole = services(40);
        let half = services(20);
        let mut f = std::fs::File::create(&path).unwrap();
        f.write_all(half.as_bytes()).unwrap();
        f.sync_data().unwrap();
        tokio::time::sleep(Duration::from_millis(50)).await;
        f.write_all(&whole.as_bytes()[half.len()..]).unwrap();
        drop(f);
        let read = tokio::time::timeout(Duration::from_secs(10), events.recv()).await;
        assert_eq!(
            services_in(&mut held, read.unwrap().unwrap()),
            40,
            "read after it settled"
        );
        source.abort();
        let _ = std::fs::remove_dir_all(&dir);
    }
}
