//! What `/healthz` answers: healthy once the gate is open and the runtime is connected, and for
//! as long as the node lock and the CDI dir are what the daemon opened (issue 39). `/readyz`
//! adds the kubelet's registrations (a pod is ready once it can serve every door it is
//! configured for); `/livez` says whether the daemon's engine still answers (a hung daemon fails
//! it, so the kubelet restarts it).

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex, PoisonError};
use std::time::{Duration, Instant};

/// A check `/readyz` adds to the health: `Err` with a sentence while not ready.
pub type ReadinessCheck = Box<dyn Fn() -> Result<(), String> + Send + Sync>;

/// Shared health flags, set by the daemon and read by `/healthz`.
///
/// Cloning shares the same flags. Both start false: a daemon is healthy only after it connected to
/// the runtime and opened the gate (Synchronize answered and its updates delivered).
#[derive(Clone, Debug, Default)]
pub struct HealthState {
    inner: Arc<Flags>,
}

#[derive(Default)]
struct Flags {
    gate_open: AtomicBool,
    runtime_connected: AtomicBool,
    /// Why the node lock is no longer held, in one sentence.
    node_lock: Mutex<Option<String>>,
    /// Why the CDI dir is no longer the one opened, in one sentence.
    cdi_dir: Mutex<Option<String>>,
    /// When the engine last answered the daemon's periodic round (none: not yet).
    last_beat: Mutex<Option<Instant>>,
    /// What else readiness needs (the kubelet's registrations), by name.
    readiness: Mutex<Vec<(String, ReadinessCheck)>>,
}

impl std::fmt::Debug for Flags {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Flags")
            .field("gate_open", &self.gate_open)
            .field("runtime_connected", &self.runtime_connected)
            .field("node_lock", &self.node_lock)
            .field("cdi_dir", &self.cdi_dir)
            .field("last_beat", &self.last_beat)
            .finish_non_exhaustive()
    }
}

impl HealthState {
    /// New state: gate closed, runtime not connected.
    pub fn new() -> Self {
        Self::default()
    }

    /// Record whether the gate is open (it closes while the NRI connection is lost).
    pub fn set_gate_open(&self, open: bool) {
        self.inner.gate_open.store(open, Ordering::Release);
    }

    /// Record whether the NRI connection to the runtime is up.
    pub fn set_runtime_connected(&self, connected: bool) {
        self.inner
            .runtime_connected
            .store(connected, Ordering::Release);
    }

    /// Record why the node lock is no longer held (`None`: it is).
    pub fn set_node_lock_problem(&self, problem: Option<String>) {
        *self
            .inner
            .node_lock
            .lock()
            .unwrap_or_else(PoisonError::into_inner) = problem;
    }

    /// Record why the configured CDI dir is not the one opened (`None`: it is).
    pub fn set_cdi_dir_problem(&self, problem: Option<String>) {
        *self
            .inner
            .cdi_dir
            .lock()
            .unwrap_or_else(PoisonError::into_inner) = problem;
    }

    /// `Ok(())` when healthy, else the reason in one sentence (what `/healthz` answers with 503).
    /// A lost node lock goes first, then a moved CDI dir: either refuses claims whatever the
    /// runtime does.
    pub fn check(&self) -> Result<(), String> {
        for problem in [&self.inner.node_lock, &self.inner.cdi_dir] {
            if let Some(p) = problem
                .lock()
                .unwrap_or_else(PoisonError::into_inner)
                .clone()
            {
                return Err(p);
            }
        }
        let connected = self.inner.runtime_connected.load(Ordering::Acquire);
        let open = self.inner.gate_open.load(Ordering::Acquire);
        match (connected, open) {
            (true, true) => Ok(()),
            (false, _) => Err("not connected to the container runtime's NRI socket".into()),
            (true, false) => {
                Err("gate closed: the runtime has not finished Synchronize yet".into())
            }
        }
    }

    /// Record that the engine answered the daemon's periodic round just now.
    pub fn beat(&self) {
        self.beat_at(Instant::now());
    }

    fn beat_at(&self, at: Instant) {
        *self
            .inner
            .last_beat
            .lock()
            .unwrap_or_else(PoisonError::into_inner) = Some(at);
    }

    /// Adds a check that readiness needs beside health, e.g. "the kubelet registered the DRA
    /// driver"; `name` only orders nothing and is kept for debugging.
    pub fn add_readiness_check(&self, name: &str, check: ReadinessCheck) {
        self.inner
            .readiness
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .push((name.to_string(), check));
    }

    /// `Ok(())` when healthy and every readiness check passes, else the first reason (what
    /// `/readyz` answers with 503): the pod serves every door it is configured for.
    pub fn ready(&self) -> Result<(), String> {
        self.check()?;
        let checks = self
            .inner
            .readiness
            .lock()
            .unwrap_or_else(PoisonError::into_inner);
        checks.iter().try_for_each(|(_, check)| check())
    }

    /// `Ok(())` while the engine answered within `silence` of now (what `/livez` answers): a
    /// daemon whose engine is stuck, for whatever reason, fails it and is restarted. Not yet
    /// beaten counts as alive: the first round runs as the daemon starts.
    pub fn live(&self, silence: Duration) -> Result<(), String> {
        self.live_at(Instant::now(), silence)
    }

    fn live_at(&self, now: Instant, silence: Duration) -> Result<(), String> {
        let last = *self
            .inner
            .last_beat
            .lock()
            .unwrap_or_else(PoisonError::into_inner);
        match last {
            Some(at) if now.saturating_duration_since(at) > silence => Err(format!(
                "the daemon's engine has not answered its periodic round for {} s (more than {} s): the daemon is hung; restart it and report its log",
                now.saturating_duration_since(at).as_secs(),
                silence.as_secs()
            )),
            _ => Ok(()),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn healthy() -> HealthState {
        let h = HealthState::new();
        h.set_runtime_connected(true);
        h.set_gate_open(true);
        h
    }

    #[test]
    fn ready_needs_health_and_every_check() {
        let h = healthy();
        assert_eq!(h.ready(), Ok(()));
        let registered = Arc::new(AtomicBool::new(false));
        let r = registered.clone();
        h.add_readiness_check(
            "dra",
            Box::new(move || {
                if r.load(Ordering::Acquire) {
                    Ok(())
                } else {
                    Err("the kubelet has not registered the DRA driver".into())
                }
            }),
        );
        assert_eq!(
            h.ready(),
            Err("the kubelet has not registered the DRA driver".into())
        );
        assert_eq!(h.check(), Ok(()), "health does not wait for the kubelet");
        registered.store(true, Ordering::Release);
        assert_eq!(h.ready(), Ok(()));
        h.set_gate_open(false);
        assert!(h.ready().unwrap_err().contains("gate closed"));
    }

    #[test]
    fn live_fails_once_the_engine_is_silent_too_long() {
        let h = HealthState::new();
        let start = Instant::now();
        let silence = Duration::from_secs(30);
        assert_eq!(
            h.live_at(start, silence),
            Ok(()),
            "not beaten yet: starting"
        );
        h.beat_at(start);
        assert_eq!(h.live_at(start + Duration::from_secs(30), silence), Ok(()));
        let err = h
            .live_at(start + Duration::from_secs(31), silence)
            .unwrap_err();
        assert!(err.contains("for 31 s"), "{err}");
        h.beat_at(start + Duration::from_secs(31));
        assert_eq!(h.live_at(start + Duration::from_secs(40), silence), Ok(()));
    }
}
