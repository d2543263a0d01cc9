//! The assembled agent (`lb::agent::Agent`: the worker, the source, the
//! metrics server and the event loop) over the fake maps, without root: it
//! follows its services file through edits, keeps the last good state when
//! the file turns invalid (and counts the error), answers /metrics, and
//! stops when told, its worker done within the wait. The process around it (the
//! flags, the data path install, signals) is proven by the integration
//! tests, which run the real binary as root.
use std::{
    io::{Read as _, Write as _},
    net::{SocketAddr, TcpListener, TcpStream},
    path::Path,
    sync::{
        atomic::{AtomicBool, Ordering},
        Arc,
    },
    time::{Duration, Instant},
};

use lb::{
    agent::{
        assembly::{Endpoints, Source},
        router::Control,
        worker::Worker,
        Agent,
    },
    health::NodeEligibility,
    maps::fake::FakeMaps,
    metrics::Metrics,
    model::Algorithm,
    reconcile::Reconciler,
};

fn services(n: usize) -> String {
    let mut s = String::from("services:\n");
    for i in 0..n {
        s.push_str(&format!(
            "  - {{name: web-{i}, clusterIPs: [10.96.0.{}], ports: [{{port: 80}}], backends: [{{address: 10.0.0.{}}}]}}\n",
            i + 1,
            i + 1
        ));
    }
    s
}

/// Written beside and renamed over, as editors and config management do.
fn write(path: &Path, text: &str) {
    let tmp = path.with_extension("tmp");
    std::fs::write(&tmp, text).unwrap();
    std::fs::rename(&tmp, path).unwrap();
}

fn wait(what: &str, timeout: Duration, mut cond: impl FnMut() -> bool) {
    let start = Instant::now();
    while !cond() {
        assert!(start.elapsed() < timeout, "timed out waiting for {what}");
        std::thread::sleep(Duration::from_millis(10));
    }
}

fn free_port() -> SocketAddr {
    TcpListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap()
}

fn get(addr: SocketAddr, path: &str) -> Option<String> {
    let mut s = TcpStream::connect_timeout(&addr, Duration::from_secs(1)).ok()?;
    s.set_read_timeout(Some(Duration::from_secs(2))).ok()?;
    write!(s, "GET {path} HTTP/1.0\r\nHost: x\r\n\r\n").ok()?;
    let mut out = String::new();
    s.read_to_string(&mut out).ok()?;
    Some(out)
}

/// The sum of the samples of `name` in a scrape.
fn sample(text: &str, name: &str) -> f64 {
    text.lines()
        .filter(|l| l.split([' ', '{']).next() == Some(name))
        .filter_map(|l| l.rsplit(' ').next()?.parse::<f64>().ok())
        .sum()
}

#[test]
fn an_agent_over_fake_maps_follows_its_file_keeps_the_last_good_state_and_stops_when_told() {
    let dir = std::env::temp_dir().join(format!("lb-agent-assembly-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&dir);
    std::fs::create_dir_all(&dir).unwrap();
    let path = dir.join("services.yaml");
    write(&path, &services(2));

    let (metrics, registry) = Metrics::new(dir.join("pins"));
    let cancel = Arc::new(AtomicBool::new(false));
    let reconciler = Reconciler::restore(FakeMaps::default())
        .unwrap()
        .with_cancel(cancel.clone());
    let worker = Worker::new(reconciler, metrics.clone(), Box::new(|_| {}))
        .with_status_file(dir.join("status.json"));
    let context = lb::source::file::node_context(&[], &[], Algorithm::Random).unwrap();
    let addr = free_port();
    let agent = Agent::new(
        worker,
        cancel.clone(),
        Source::File {
            path: path.clone(),
            context,
            follow: None,
        },
        Endpoints {
            metrics: addr,
            healthz: None,
            healthz_grace: Duration::from_secs(30),
        },
        (metrics.clone(), registry),
        Arc::new(NodeEligibility::default()),
    );
    let rt = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .unwrap();
    let (control, control_rx) = tokio::sync::mpsc::channel(4);
    let running = rt.spawn(agent.run(control_rx));

    let frontends = || metrics.frontends.get();
    wait(
        "the file's 2 services in the maps",
        Duration::from_secs(10),
        || frontends() == 2,
    );
    // The metrics server answers with the same state.
    let mut scrape = String::new();
    wait("/metrics to answer", Duration::from_secs(10), || {
        scrape = get(addr, "/metrics").unwrap_or_default();
        scrape.contains("lb_frontends")
    });
    assert_eq!(sample(&scrape, "lb_frontends"), 2.0, "{scrape}");

    write(&path, &services(3));
    wait("the edit's third service", Duration::from_secs(10), || {
        frontends() == 3
    });

    // An invalid file: counted, and the maps keep the last good state,
    // still so once everything after the error had time to arrive.
    let errors = || {
        sample(
            &get(addr, "/metrics").unwrap_or_default(),
            "lb_source_errors_total",
        )
    };
    let before = errors();
    write(
        &path,
        "services:\n  - {name: broken, ports: [{port: 99999}]}\n",
    );
    wait(
        "the invalid file to be counted",
        Duration::from_secs(10),
        || errors() > before,
    );
    std::thread::sleep(Duration::from_millis(500));
    assert_eq!(frontends(), 3, "the last good state stays");
    let reconciles = sample(&get(addr, "/metrics").unwrap(), "lb_reconciles_total");

    // Fixed: followed again.
    write(&path, &services(1));
    wait("the fixed file", Duration::from_secs(10), || {
        frontends() == 1
    });
    assert!(
        sample(&get(addr, "/metrics").unwrap(), "lb_reconciles_total") > reconciles,
        "the fixed file was reconciled"
    );

    let asked = Instant::now();
    rt.block_on(control.send(Control::Stop)).unwrap();
    let stopped = rt
        .block_on(async { tokio::time::timeout(Duration::from_secs(5), running).await })
        .expect("the agent stops within 5 s")
        .expect("the agent's task")
        .expect("the agent stops without error");
    assert!(
        stopped.worker_stopped,
        "the worker let go of its state within the wait"
    );
    assert!(
        asked.elapsed() < lb::agent::assembly::WORKER_STOP_WAIT,
        "an idle worker stops at once: {:?}",
        asked.elapsed()
    );
    assert!(
        cancel.load(Ordering::Relaxed),
        "the reconciler was told to stop"
    );
    drop(rt);
    let _ = std::fs::remove_dir_all(&dir);
}
