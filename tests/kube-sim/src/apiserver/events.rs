//! What watchers see: every change to a stored object as an event with the resourceVersion it
//! made, kept for a while so that a watch can resume from a resourceVersion a list gave it.

use std::collections::VecDeque;

use serde_json::{Value, json};

/// Events kept for watches that resume; a watch from an older resourceVersion gets
/// `410 Gone` ("too old resource version") and must list again, as on a real server.
pub const HISTORY: usize = 4096;

/// One change.
#[derive(Debug, Clone)]
pub struct Event {
    /// The resourceVersion the change made.
    pub rv: u64,
    /// The resource plural.
    pub plural: &'static str,
    /// `ADDED`, `MODIFIED` or `DELETED`.
    pub kind: &'static str,
    /// The object after the change (for `DELETED`, as it was, with the deletion's version).
    pub object: Value,
}

impl Event {
    /// The line a watch stream carries.
    pub fn line(&self) -> String {
        let mut object = self.object.clone();
        object["metadata"]["resourceVersion"] = json!(self.rv.to_string());
        let mut line = json!({"type": self.kind, "object": object}).to_string();
        line.push('\n');
        line
    }
}

/// The event history and the signal that wakes watches.
#[derive(Debug)]
pub struct Events {
    log: VecDeque<Event>,
    changed: tokio::sync::watch::Sender<u64>,
}

impl Default for Events {
    fn default() -> Self {
        Events {
            log: VecDeque::new(),
            changed: tokio::sync::watch::channel(0).0,
        }
    }
}

/// A watch asked to resume from a resourceVersion the history no longer holds.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct TooOld;

impl Events {
    /// Records a change and wakes the watches.
    pub fn push(&mut self, event: Event) {
        let rv = event.rv;
        if self.log.len() == HISTORY {
            self.log.pop_front();
        }
        self.log.push_back(event);
        self.changed.send_replace(rv);
    }

    /// A receiver that changes with every event.
    pub fn subscribe(&self) -> tokio::sync::watch::Receiver<u64> {
        self.changed.subscribe()
    }

    /// The events of `plural` after resourceVersion `after`, or [`TooOld`] when some of them
    /// are no longer kept.
    pub fn since(&self, plural: &str, after: u64) -> Result<Vec<Event>, TooOld> {
        if let Some(first) = self.log.front()
            && first.rv > after + 1
            && self.log.len() == HISTORY
        {
            return Err(TooOld);
        }
        Ok(self
            .log
            .iter()
            .filter(|e| e.rv > after && e.plural == plural)
            .cloned()
            .collect())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn event(rv: u64) -> Event {
        Event {
            rv,
            plural: "resourceslices",
            kind: "ADDED",
            object: json!({"metadata": {"name": format!("s{rv}")}}),
        }
    }

    #[test]
    fn a_watch_resumes_after_its_version_until_the_history_is_cut() {
        let mut events = Events::default();
        for rv in 1..=3 {
            events.push(event(rv));
        }
        let after: Vec<u64> = events
            .since("resourceslices", 1)
            .unwrap()
            .iter()
            .map(|e| e.rv)
            .collect();
        assert_eq!(after, [2, 3]);
        assert!(events.since("nodes", 0).unwrap().is_empty());
        for rv in 4..(HISTORY as u64 + 10) {
            events.push(event(rv));
        }
        assert!(matches!(events.since("resourceslices", 1), Err(TooOld)));
        assert!(events.since("resourceslices", HISTORY as u64).is_ok());
        let line = event(7).line();
        assert!(line.ends_with('\n'));
        assert!(line.contains(r#""resourceVersion":"7""#), "{line}");
    }
}
