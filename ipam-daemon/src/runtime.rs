//! The one loop every controller of the daemon runs under.
//!
//! A controller says what one pass is (read its inputs, decide, carry the decision out) and
//! what wakes it (a copy of the store changed, a channel it reads changed); the runner does
//! the rest the same way for all of them:
//! - **when**: a pass at the start, then at every change of an input, and after the wait the
//!   pass asked for ([`Next`]), whichever comes first;
//! - **backoff**: a pass that fails is tried again after a delay that grows while it keeps
//!   failing (`ipam_core::backoff`), and its error is logged with the delay, so a condition
//!   that time can fix is waited out and said, never a crash;
//! - **spans**: each pass runs in a span named after the controller;
//! - **metrics**: passes by controller and result, and how long they took
//!   (`ipam_controller_passes_total`, `ipam_controller_pass_duration_seconds`).
//!
//! A controller's decision lives in `ipam-core` as a pure function where it has one
//! (`routes::desired_routes`, `ipam_core::dead_nodes`); its pass is the glue: read, call,
//! apply.

use std::{fmt, future::Future, sync::Arc, time::Duration};

use ipam_core::backoff::Backoff;
use tokio::time::Instant;
use tracing::Instrument as _;

use crate::metrics::Metrics;

/// When to pass again, besides at the next change of an input.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Next {
    /// Only at the next change of an input.
    OnChange,
    /// After this long at the latest (something to look at again by time: a recheck, a
    /// hold that ends).
    Within(Duration),
    /// At once: a write lost a race with another writer, so read again.
    Now,
    /// What the pass needs is not there yet and another controller makes it (a record not
    /// created yet): again with the backoff's delay, without a warning.
    Waiting,
}

/// What woke a controller between two passes.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Woken {
    /// An input changed: pass again.
    Changed,
    /// An input ended for good (its sender dropped, the role stopped): the controller ends.
    Closed,
}

/// One controller: its pass and what wakes it. See the module's documentation.
pub trait Controller: Send + 'static {
    /// Its name in logs, spans and metrics, in snake case: `routes`, `dead_peers`.
    const NAME: &'static str;
    /// Why a pass failed. Its text names the object and says what failed; the runner adds
    /// when it tries again.
    type Error: fmt::Display + Send;
    /// Longest wait between two attempts of a pass that keeps failing.
    const RETRY_CAP: Duration = Duration::from_secs(10);

    /// One pass: read the inputs, decide, carry the decision out.
    fn pass(&mut self) -> impl Future<Output = Result<Next, Self::Error>> + Send;

    /// A pass that failed in part may have other work due sooner than the backoff's delay
    /// (a rate limit's window that ends): the runner passes again at the earlier of the two.
    fn due_despite(_error: &Self::Error) -> Option<Duration> {
        None
    }

    /// Returns when an input changes. Must be cancel safe: the runner drops it when the
    /// wait the last pass asked for ends first.
    fn changed(&mut self) -> impl Future<Output = Woken> + Send;
}

/// Runs `controller` until one of its inputs closes.
pub async fn run<C: Controller>(mut controller: C, metrics: Arc<Metrics>) {
    let mut backoff = Backoff::new(C::RETRY_CAP);
    loop {
        let started = Instant::now();
        let outcome = controller
            .pass()
            .instrument(tracing::debug_span!("pass", controller = C::NAME))
            .await;
        metrics.controller_pass(C::NAME, outcome.is_ok(), started.elapsed());
        let wait = match outcome {
            Ok(Next::OnChange) => {
                backoff.reset();
                None
            }
            Ok(Next::Within(delay)) => {
                backoff.reset();
                Some(delay)
            }
            Ok(Next::Now) => Some(Duration::ZERO),
            Ok(Next::Waiting) => Some(backoff.next_delay()),
            Err(e) => {
                let delay = backoff.next_delay();
                let delay = C::due_despite(&e).map_or(delay, |due| due.min(delay));
                tracing::warn!(
                    controller = C::NAME,
                    retry_in_ms = delay.as_millis() as u64,
                    "{e}; trying again in {} ms",
                    delay.as_millis()
                );
                Some(delay)
            }
        };
        let timer = async {
            match wait {
                Some(delay) => tokio::time::sleep(delay).await,
                None => std::future::pending().await,
            }
        };
        tokio::select! {
            () = timer => {}
            woken = controller.changed() => if woken == Woken::Closed {
                tracing::debug!(controller = C::NAME, "an input closed: the controller ends");
                return;
            },
        }
    }
}

#[cfg(test)]
mod tests {
    use std::sync::Mutex;

    use tokio::sync::watch;

    use super::*;

    /// A controller whose passes answer from a script and record when they ran.
    struct Scripted {
        answers: Vec<Result<Next, &'static str>>,
        ran: Arc<Mutex<Vec<Duration>>>,
        start: Instant,
        input: watch::Receiver<u32>,
    }

    impl Controller for Scripted {
        const NAME: &'static str = "scripted";
        type Error = &'static str;
        const RETRY_CAP: Duration = Duration::from_secs(2);

        fn due_despite(error: &&'static str) -> Option<Duration> {
            error
                .starts_with("partly")
                .then_some(Duration::from_millis(100))
        }

        async fn pass(&mut self) -> Result<Next, &'static str> {
            self.ran.lock().unwrap().push(self.start.elapsed());
            if self.answers.is_empty() {
                Ok(Next::OnChange)
            } else {
                self.answers.remove(0)
            }
        }

        async fn changed(&mut self) -> Woken {
            match self.input.changed().await {
                Ok(()) => Woken::Changed,
                Err(_) => Woken::Closed,
            }
        }
    }

    fn scripted(
        answers: Vec<Result<Next, &'static str>>,
    ) -> (Scripted, Arc<Mutex<Vec<Duration>>>, watch::Sender<u32>) {
        let ran = Arc::new(Mutex::new(Vec::new()));
        let (input, receiver) = watch::channel(0);
        let controller = Scripted {
            answers,
            ran: ran.clone(),
            start: Instant::now(),
            input: receiver,
        };
        (controller, ran, input)
    }

    fn millis(ran: &Mutex<Vec<Duration>>) -> Vec<u128> {
        ran.lock()
            .unwrap()
            .iter()
            .map(Duration::as_millis)
            .collect()
    }

    #[tokio::test(start_paused = true)]
    async fn failures_back_off_a_success_starts_over_and_a_closed_input_ends_it() {
        let metrics = Arc::new(Metrics::new());
        let (controller, ran, input) = scripted(vec![
            Err("cannot write node-1's record"),
            Err("cannot write node-1's record"),
            Ok(Next::Within(Duration::from_secs(3))),
            Err("cannot write node-1's record"),
        ]);
        let task = tokio::spawn(run(controller, metrics.clone()));
        tokio::time::sleep(Duration::from_secs(30)).await;
        // 0, then +500 ms ±10 %, then +750 ms ±10 %, then +3 s, then +500 ms ±10 % again
        // (the success reset the backoff), then only on a change. (A sleep ends on the
        // millisecond after its deadline: each bound has one more.)
        let at = millis(&ran);
        assert_eq!(at.len(), 5, "{at:?}");
        let gaps: Vec<u128> = at.windows(2).map(|w| w[1] - w[0]).collect();
        assert!((450..=551).contains(&gaps[0]), "{gaps:?}");
        assert!((675..=826).contains(&gaps[1]), "{gaps:?}");
        assert_eq!(gaps[2], 3000, "{gaps:?}");
        assert!((450..=551).contains(&gaps[3]), "{gaps:?}");
        input.send(1).unwrap();
        tokio::time::sleep(Duration::from_millis(1)).await;
        assert_eq!(millis(&ran).len(), 6);
        drop(input);
        task.await.unwrap();
        let text = metrics.encode_text();
        assert!(
            text.contains(
                r#"ipam_controller_passes_total{controller="scripted",result="error"} 3"#
            ),
            "{text}"
        );
        assert!(
            text.contains(r#"ipam_controller_passes_total{controller="scripted",result="ok"} 3"#),
            "{text}"
        );
    }

    #[tokio::test(start_paused = true)]
    async fn a_change_wakes_a_pass_before_its_wait_ends_and_now_passes_at_once() {
        let (controller, ran, input) = scripted(vec![
            Ok(Next::Within(Duration::from_secs(10))),
            Ok(Next::Now),
            Ok(Next::Waiting),
        ]);
        let task = tokio::spawn(run(controller, Arc::new(Metrics::new())));
        tokio::time::sleep(Duration::from_secs(1)).await;
        input.send(1).unwrap();
        tokio::time::sleep(Duration::from_secs(5)).await;
        let at = millis(&ran);
        // 0; the change at 1 s; `Now` at once; `Waiting` after the first backoff delay.
        assert_eq!(at.len(), 4, "{at:?}");
        assert_eq!(&at[..3], &[0, 1000, 1000]);
        assert!((1450..=1551).contains(&at[3]), "{at:?}");
        drop(input);
        task.await.unwrap();
    }
    #[tokio::test(start_paused = true)]
    async fn the_backoff_stops_at_the_cap_and_work_due_sooner_is_not_held_back() {
        let failing = vec![Err("cannot write node-1's record"); 6];
        let mut script = failing;
        script.push(Err("partly done: node-2's pods not marked"));
        let (controller, ran, input) = scripted(script);
        let task = tokio::spawn(run(controller, Arc::new(Metrics::new())));
        tokio::time::sleep(Duration::from_secs(30)).await;
        let at = millis(&ran);
        let gaps: Vec<u128> = at.windows(2).map(|w| w[1] - w[0]).collect();
        // 500, 750, 1125, 1687 ms (each ±10 %), then the 2 s cap twice (less its jitter,
        // never more: uncapped, the next would be 2.5 s and 3.8 s); then the partial
        // failure's own 100 ms.
        assert_eq!(gaps.len(), 7, "{gaps:?}");
        assert!((1518..=1857).contains(&gaps[3]), "{gaps:?}");
        assert!(
            gaps[4..6].iter().all(|g| (1800..=2000).contains(g)),
            "{gaps:?}"
        );
        assert_eq!(gaps[6], 100, "{gaps:?}");
        drop(input);
        task.await.unwrap();
    }
}
