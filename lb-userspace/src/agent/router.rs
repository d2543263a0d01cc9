//! The agent's event loop: source events go to the health-check tracker
//! (which publishes the NodePort health checks when they change) and to the
//! worker's mailbox; control messages (the binary turns SIGHUP into
//! `Reload`, SIGTERM and SIGINT into `Stop`) ask the source to re-read or
//! end the loop. The binary only maps signals; the loop is tested here.
use std::{collections::BTreeMap, sync::Arc};

use tokio::sync::{mpsc, watch};
use tracing::info;

use super::mailbox::Mailbox;
use crate::{
    health::services::{Check, Tracker},
    source::SourceEvent,
};

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Control {
    /// Re-read the source (SIGHUP).
    Reload,
    /// Leave the loop (SIGTERM, SIGINT).
    Stop,
}

pub struct Router {
    pub mailbox: Arc<Mailbox>,
    /// The NodePort health checks, for `health::services::run`.
    pub checks: watch::Sender<BTreeMap<u16, Check>>,
    /// Asks the source to re-read; a request already waiting is enough.
    pub reload: mpsc::Sender<()>,
    pub tracker: Tracker,
}

impl Router {
    /// Runs until `Stop` (or the control channel closes). A source that
    /// ends (its channel closed) leaves the loop waiting for control: the
    /// data path keeps serving what it has.
    pub async fn run(
        mut self,
        mut events: mpsc::Receiver<SourceEvent>,
        mut control: mpsc::Receiver<Control>,
    ) {
        loop {
            tokio::select! {
                Some(ev) = events.recv() => self.deliver(ev),
                c = control.recv() => match c {
                    Some(Control::Reload) => {
                        info!("SIGHUP: re-reading the source");
                        let _ = self.reload.try_send(());
                    }
                    Some(Control::Stop) | None => return,
                },
            }
        }
    }

    fn deliver(&mut self, ev: SourceEvent) {
        if self.tracker.observe(&ev) {
            let _ = self.checks.send(self.tracker.checks());
        }
        self.mailbox.post(ev);
    }
}

#[cfg(test)]
mod tests {
    use std::time::{Duration, Instant};

    use super::*;
    use crate::source::file::parse::parse;

    /// A LoadBalancer service with externalTrafficPolicy: Local and a
    /// health check node port (as the Kubernetes source gives it).
    fn local_lb() -> SourceEvent {
        let mut model = parse("services:\n  - name: web\n    type: LoadBalancer\n    externalTrafficPolicy: Local\n    clusterIPs: [10.96.0.10]\n    loadBalancerIPs: [203.0.113.10]\n    ports:\n      - {port: 80, targetPort: 8080}\n    backends: [{address: 10.244.1.2, local: true}]\n").unwrap();
        for svc in model.services.values_mut() {
            svc.health_check_node_port = Some(32000);
        }
        SourceEvent::Full {
            model,
            observed: Instant::now(),
            triggers: Vec::new(),
        }
    }

    #[tokio::test]
    async fn events_reach_the_mailbox_and_checks_reload_asks_the_source_and_stop_ends_the_loop() {
        let mailbox = Arc::new(Mailbox::default());
        let (checks, mut checks_rx) = watch::channel(BTreeMap::new());
        let (reload, mut reload_rx) = mpsc::channel(1);
        let router = Router {
            mailbox: mailbox.clone(),
            checks,
            reload,
            tracker: Tracker::default(),
        };
        let (events_tx, events) = mpsc::channel(8);
        let (control_tx, control) = mpsc::channel(8);
        let task = tokio::spawn(router.run(events, control));

        events_tx.send(local_lb()).await.unwrap();
        tokio::time::timeout(Duration::from_secs(5), checks_rx.changed())
            .await
            .expect("health checks published")
            .unwrap();
        assert!(
            checks_rx.borrow().contains_key(&32000),
            "{:?}",
            *checks_rx.borrow()
        );
        let got = mailbox.take(Duration::from_secs(5)).unwrap();
        assert_eq!(
            got.full
                .expect("the model reached the mailbox")
                .services
                .len(),
            1
        );

        control_tx.send(Control::Reload).await.unwrap();
        control_tx.send(Control::Reload).await.unwrap();
        tokio::time::timeout(Duration::from_secs(5), reload_rx.recv())
            .await
            .expect("reload asked")
            .unwrap();

        // A source that ends leaves the loop running: it still answers
        // control messages.
        drop(events_tx);
        tokio::time::sleep(Duration::from_millis(50)).await;
        assert!(!task.is_finished(), "the loop ended with its source");
        control_tx.send(Control::Reload).await.unwrap();
        tokio::time::timeout(Duration::from_secs(5), reload_rx.recv())
            .await
            .expect("reload asked after the source ended")
            .unwrap();
        control_tx.send(Control::Stop).await.unwrap();
        tokio::time::timeout(Duration::from_secs(5), task)
            .await
            .expect("Stop ends the loop")
            .unwrap();
    }
}
