//! The Kubernetes watch loop against a scripted apiserver: initial list,
//! changes, 410 Gone and relist, dropped connections, an apiserver that goes
//! away, and no prune on a partial view.
use std::time::Duration;

use lb::{
    model::ServiceName,
    source::{
        kubernetes::watch::{self, WatchConfig},
        SourceEvent,
    },
};
use lb_testkit::apiserver::{objects, FakeApiServer, Kind};
use tokio::sync::mpsc;

struct Watch {
    rx: mpsc::Receiver<SourceEvent>,
    _task: tokio::task::JoinHandle<()>,
}

async fn start(api: &FakeApiServer) -> Watch {
    let mut config = kube::Config::new(api.url().parse().unwrap());
    config.default_retry = false; // as lb-agent does: failures must surface

    let client = kube::Client::try_from(config).unwrap();
    let (tx, rx) = mpsc::channel(64);
    let cfg = WatchConfig {
        node_name: "node-a".into(),
        nodeports: Default::default(),
        debounce: Duration::from_millis(30),
        node_eligibility: Default::default(),
        default_algorithm: Default::default(),
        changes: Default::default(),
        local_addresses: None,
    };
    Watch {
        rx,
        _task: tokio::spawn(watch::run(
            vec![watch::ApiServer {
                url: api.url(),
                client,
            }],
            cfg,
            tx,
        )),
    }
}

impl Watch {
    /// The next model event (Full or Changes), skipping errors and warnings
    /// (returned separately).
    async fn next_model(&mut self, timeout: Duration) -> (Option<SourceEvent>, Vec<String>) {
        let mut errors = Vec::new();
        let deadline = tokio::time::Instant::now() + timeout;
        loop {
            match tokio::time::timeout_at(deadline, self.rx.recv()).await {
                Ok(Some(SourceEvent::Error { reason, .. })) => errors.push(reason.to_string()),
                Ok(Some(SourceEvent::Warning { .. })) => {}
                Ok(Some(ev)) => return (Some(ev), errors),
                Ok(None) | Err(_) => return (None, errors),
            }
        }
    }
}

fn web() -> serde_json::Value {
    objects::service("default", "web", "10.96.0.10", 80, 8080, "TCP")
}

fn web_slice(ips: &[&str]) -> serde_json::Value {
    objects::slice("default", "web-1", "web", ips, 8080, "TCP", "node-a")
}

fn populated() -> FakeApiServer {
    let api = FakeApiServer::start();
    api.apply(objects::node("node-a", "192.168.1.10"));
    api.apply(web());
    api.apply(web_slice(&["10.244.0.1"]));
    api.apply(objects::service(
        "default",
        "db",
        "10.96.0.20",
        5432,
        5432,
        "TCP",
    ));
    api
}

fn n(name: &str) -> ServiceName {
    ServiceName::new("default", name)
}

#[tokio::test]
async fn initial_list_gives_one_full_model_and_nothing_before_every_list_completes() {
    let api = populated();
    api.hold_lists(Kind::Node, true);
    let mut w = start(&api).await;
    let (ev, _) = w.next_model(Duration::from_millis(700)).await;
    assert!(
        ev.is_none(),
        "nothing may be output (or pruned) before the node list completes: {ev:?}"
    );
    api.hold_lists(Kind::Node, false);
    let (ev, _) = w.next_model(Duration::from_secs(10)).await;
    let Some(SourceEvent::Full { model, .. }) = ev else {
        panic!("full model expected, got {ev:?}")
    };
    assert_eq!(
        model.services.keys().cloned().collect::<Vec<_>>(),
        vec![n("db"), n("web")]
    );
    assert_eq!(model.services[&n("web")].frontends[0].backends.len(), 1);
    assert!(
        model.services[&n("web")].frontends[0].backends[0].local,
        "nodeName node-a is this node"
    );
}

#[tokio::test]
async fn adds_changes_and_deletes_arrive_as_changes_of_those_services_only() {
    let api = populated();
    let mut w = start(&api).await;
    assert!(matches!(
        w.next_model(Duration::from_secs(10)).await.0,
        Some(SourceEvent::Full { .. })
    ));

    api.apply(web_slice(&["10.244.0.1", "10.244.0.2"]));
    let (ev, _) = w.next_model(Duration::from_secs(10)).await;
    let Some(SourceEvent::Changes { changes, .. }) = ev else {
        panic!("{ev:?}")
    };
    assert_eq!(changes.len(), 1);
    assert_eq!(changes[0].0, n("web"));
    assert_eq!(
        changes[0].1.as_ref().unwrap().frontends[0].backends.len(),
        2
    );

    api.apply(objects::service(
        "default",
        "cache",
        "10.96.0.30",
        6379,
        6379,
        "TCP",
    ));
    api.delete(Kind::Service, "default", "db");
    let (ev, _) = w.next_model(Duration::from_secs(10)).await;
    let Some(SourceEvent::Changes { mut changes, .. }) = ev else {
        panic!("{ev:?}")
    };
    changes.sort_by(|a, b| a.0.cmp(&b.0));
    assert_eq!(
        changes.len(),
        2,
        "both within one debounce window: {changes:?}"
    );
    assert_eq!(changes[0].0, n("cache"));
    assert_eq!(changes[1], (n("db"), None));
}

#[tokio::test]
async fn watch_expired_410_gone_relists_and_prunes_with_a_full_model() {
    let api = populated();
    let mut w = start(&api).await;
    assert!(matches!(
        w.next_model(Duration::from_secs(10)).await.0,
        Some(SourceEvent::Full { .. })
    ));

    // db disappears while the history is compacted: only a relist can tell.
    api.delete_silently(Kind::Service, "default", "db");
    api.expire();
    // Each watcher relists on its own; every relist gives a full model (the
    // ones before the services relist still hold the old, complete list).
    // The one after the services relist no longer has db: that prunes it.
    let deadline = tokio::time::Instant::now() + Duration::from_secs(20);
    let mut all_errors = Vec::new();
    loop {
        let (ev, errors) = w.next_model(deadline - tokio::time::Instant::now()).await;
        all_errors.extend(errors);
        match ev {
            Some(SourceEvent::Full { model, .. }) if !model.services.contains_key(&n("db")) => {
                assert_eq!(
                    model.services.keys().cloned().collect::<Vec<_>>(),
                    vec![n("web")]
                );
                break;
            }
            Some(SourceEvent::Full { .. }) => continue,
            other => panic!("relist must end in a full model without db, got {other:?}"),
        }
    }
    assert!(
        all_errors.iter().any(|e| e == "watch-expired"),
        "the 410 is reported: {all_errors:?}"
    );
    assert!(
        api.requests()
            .iter()
            .filter(|r| *r == "list services")
            .count()
            >= 2,
        "{:?}",
        api.requests()
    );
}

#[tokio::test]
async fn dropped_watch_connection_resumes_from_its_resource_version_without_relist() {
    let api = populated();
    let mut w = start(&api).await;
    assert!(matches!(
        w.next_model(Duration::from_secs(10)).await.0,
        Some(SourceEvent::Full { .. })
    ));
    let lists_before = api
        .requests()
        .iter()
        .filter(|r| r.starts_with("list"))
        .count();

    api.disconnect();
    tokio::time::sleep(Duration::from_millis(200)).await;
    api.apply(web_slice(&["10.244.0.9"]));
    let (ev, _) = w.next_model(Duration::from_secs(10)).await;
    let Some(SourceEvent::Changes { changes, .. }) = ev else {
        panic!("{ev:?}")
    };
    assert_eq!(
        changes[0].1.as_ref().unwrap().frontends[0].backends[0]
            .address
            .to_string(),
        "10.244.0.9"
    );
    let lists_after = api
        .requests()
        .iter()
        .filter(|r| r.starts_with("list"))
        .count();
    assert_eq!(
        lists_before,
        lists_after,
        "a dropped connection resumes the watch: {:?}",
        api.requests()
    );
}

#[tokio::test]
async fn apiserver_down_reports_errors_keeps_quiet_on_the_model_and_converges_after() {
    let api = populated();
    let mut w = start(&api).await;
    assert!(matches!(
        w.next_model(Duration::from_secs(10)).await.0,
        Some(SourceEvent::Full { .. })
    ));

    api.set_down(true);
    api.apply(web_slice(&["10.244.0.7"])); // changes while nobody can see them
    let (ev, errors) = w.next_model(Duration::from_secs(3)).await;
    assert!(ev.is_none(), "no model while the apiserver is down: {ev:?}");
    assert!(
        !errors.is_empty(),
        "the outage is reported; requests: {:?}",
        api.requests()
    );

    api.set_down(false);
    // Converges: either the resumed watch delivers the change, or a relist does.
    let deadline = tokio::time::Instant::now() + Duration::from_secs(30);
    loop {
        let (ev, _) = w.next_model(deadline - tokio::time::Instant::now()).await;
        let web = match ev {
            Some(SourceEvent::Full { model, .. }) => model.services.get(&n("web")).cloned(),
            Some(SourceEvent::Changes { changes, .. }) => changes
                .into_iter()
                .find(|c| c.0 == n("web"))
                .and_then(|c| c.1),
            _ => panic!("did not converge after the apiserver came back"),
        };
        if web.is_some_and(|s| s.frontends[0].backends[0].address.to_string() == "10.244.0.7") {
            break;
        }
    }
}
