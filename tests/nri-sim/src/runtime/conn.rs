//! The fake runtime's side of one plugin connection: the socket reader with the Go-style conn
//! readers, the runtime service (RegisterPlugin, UpdateContainers), registration with
//! Configure and Synchronize, and plugin calls with the request timeout.

use std::collections::HashMap;
use std::sync::atomic::{AtomicU32, AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use nri_proto::api::*;
use nri_proto::protobuf::Message;
use tokio::net::UnixStream;
use tokio::sync::{oneshot, watch};

use super::calls::{encode_sync_chunks, nri_mask_for};
use super::socket::{FrameReader, PluginSocket};
use super::{
    CODE_DEADLINE_EXCEEDED, CODE_UNIMPLEMENTED, CODE_UNKNOWN, FakeError, FakeRuntime,
    PLUGIN_SERVICE, PluginConn, PluginInfo, RUNTIME_SERVICE, Waiting,
};
use crate::wire::{self, GoConnReader, Request, Response};

/// How often a connection's watchdog looks for calls past their deadline: a call times out
/// between its deadline and one tick later.
const DEADLINE_TICK: Duration = Duration::from_millis(25);

impl FakeRuntime {
    /// Serves one plugin connection.
    pub(super) fn attach(&self, stream: UnixStream) {
        let sock = match PluginSocket::new(stream) {
            Ok(s) => Arc::new(s),
            Err(e) => {
                self.state()
                    .errors
                    .push(format!("cannot serve a plugin socket: {e}"));
                return;
            }
        };
        let (kill, _) = watch::channel(false);
        let conn = Arc::new(PluginConn {
            info: Mutex::new(PluginInfo::default()),
            out: sock.clone(),
            pending: Mutex::new(HashMap::new()),
            next_stream: AtomicU32::new(1),
            kill,
            events: Mutex::new(Default::default()),
            next_event: AtomicU64::new(0),
            event_ended: watch::channel(0).0,
        });
        let rt = self.clone();
        let mut killed = conn.kill.subscribe();
        let c = conn.clone();
        tokio::spawn(async move {
            let why = tokio::select! {
                w = rt.read_plugin(&c, &sock) => w,
                _ = killed.wait_for(|k| *k) => "dropped by the runtime".to_string(),
            };
            sock.shutdown();
            rt.lost(&c, &why);
        });
        // The request timeout: one watchdog per connection checks the waiting calls' deadlines.
        let (rt, c) = (self.clone(), conn.clone());
        tokio::spawn(async move {
            let mut killed = c.kill.subscribe();
            let mut tick = tokio::time::interval(DEADLINE_TICK);
            tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
            loop {
                tokio::select! {
                    _ = tick.tick() => rt.expire_overdue(&c),
                    _ = killed.wait_for(|k| *k) => return,
                }
            }
        });
        // A plugin that has not registered (and been configured) in time is cut off.
        let rt = self.clone();
        let deadline = self.inner.config.registration_timeout;
        tokio::spawn(async move {
            let mut killed = conn.kill.subscribe();
            tokio::select! {
                _ = tokio::time::sleep(deadline) => {
                    let current = rt.inner.plugin.lock().unwrap_or_else(|e| e.into_inner()).clone();
                    if !current.is_some_and(|p| Arc::ptr_eq(&p, &conn)) {
                        rt.fail(&conn, "plugin did not register in time".into());
                    }
                }
                _ = killed.wait_for(|k| *k) => {}
            }
        });
    }

    /// Drops `conn`; the first reason given for a current plugin is the one recorded. The reason
    /// is recorded before the socket task is told, since that task reports a loss of its own.
    pub(super) fn lost(&self, conn: &Arc<PluginConn>, why: &str) {
        let mut cur = self.inner.plugin.lock().unwrap_or_else(|e| e.into_inner());
        if cur.as_ref().is_some_and(|p| Arc::ptr_eq(p, conn)) {
            *cur = None;
            drop(cur);
            self.state().errors.push(why.to_string());
        } else {
            drop(cur);
        }
        conn.kill.send_replace(true);
        conn.pending
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .clear();
    }

    /// Reads the socket until it closes or fails: responses on conn 1 go to their callers,
    /// requests on conn 2 to the runtime service. Returns why it stopped.
    async fn read_plugin(&self, conn: &Arc<PluginConn>, sock: &PluginSocket) -> String {
        let mut frames = FrameReader::new();
        let (mut conn1, mut conn2) = (GoConnReader::new(), GoConnReader::new());
        let mut messages = Vec::new();
        let mut last_sid = 0u32;
        loop {
            let (id, payload) = match frames.next(sock).await {
                Ok(Some(f)) => f,
                Ok(None) => return "plugin closed the connection".into(),
                Err(why) => return why,
            };
            let (reader, service) = match id {
                1 => (&mut conn1, 1),
                2 => (&mut conn2, 2),
                _ => continue,
            };
            if let Err(e) = reader.push(payload, &mut messages) {
                let why = format!("conn {service}: {e}");
                self.fail(conn, why.clone());
                return why;
            }
            for (sid, kind, body) in messages.drain(..) {
                let r = if service == 1 {
                    self.route_response(conn, sid, kind, &body)
                } else {
                    self.serve_runtime(conn, &mut last_sid, sid, kind, &body)
                };
                if let Err(why) = r {
                    self.fail(conn, why.clone());
                    return why;
                }
            }
        }
    }

    /// Hands a plugin-service response to the call waiting for it.
    fn route_response(
        &self,
        conn: &PluginConn,
        sid: u32,
        kind: u8,
        body: &[u8],
    ) -> Result<(), String> {
        if kind != wire::TYPE_RESPONSE {
            return Err(format!("conn 1: unexpected message type {kind}"));
        }
        let resp = Response::decode(body).map_err(|e| format!("conn 1: {e}"))?;
        let tx = conn
            .pending
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .remove(&sid);
        if let Some(w) = tx {
            let _ = w.tx.send(Some(resp));
        }
        Ok(())
    }

    fn fail(&self, conn: &Arc<PluginConn>, why: String) {
        if why.ends_with("connection closed") {
            return;
        }
        self.state().errors.push(why.clone());
        self.lost(conn, &why);
    }

    /// Starts answering one runtime-service request (RegisterPlugin, UpdateContainers).
    fn serve_runtime(
        &self,
        conn: &Arc<PluginConn>,
        last_sid: &mut u32,
        sid: u32,
        kind: u8,
        body: &[u8],
    ) -> Result<(), String> {
        if kind != wire::TYPE_REQUEST || sid.is_multiple_of(2) || sid <= *last_sid {
            return Err(format!("conn 2: bad stream id {sid} or type {kind}"));
        }
        *last_sid = sid;
        let req = Request::decode(body).map_err(|e| format!("conn 2: {e}"))?;
        let rt = self.clone();
        let c = conn.clone();
        tokio::spawn(async move {
            let resp = rt.handle_runtime_call(&c, req).await;
            let bytes = wire::frame_message(2, sid, wire::TYPE_RESPONSE, &resp.encode());
            let _ = c.out.write_all(&bytes).await;
        });
        Ok(())
    }

    async fn handle_runtime_call(&self, conn: &Arc<PluginConn>, req: Request) -> Response {
        let err = |code, message: String| Response {
            code,
            message,
            payload: Vec::new(),
        };
        if req.service != RUNTIME_SERVICE {
            return err(
                CODE_UNIMPLEMENTED,
                format!("unknown service {}", req.service),
            );
        }
        match req.method.as_str() {
            "RegisterPlugin" => {
                let Ok(r) = RegisterPluginRequest::parse_from_bytes(&req.payload) else {
                    return err(CODE_UNKNOWN, "bad RegisterPluginRequest".into());
                };
                match self.register(conn, r).await {
                    Ok(()) => Response {
                        payload: Vec::new(),
                        ..Default::default()
                    },
                    Err(e) => {
                        self.fail(conn, format!("registration failed: {e}"));
                        err(CODE_UNKNOWN, e.to_string())
                    }
                }
            }
            "UpdateContainers" => {
                let Ok(r) = UpdateContainersRequest::parse_from_bytes(&req.payload) else {
                    return err(CODE_UNKNOWN, "bad UpdateContainersRequest".into());
                };
                if self.inner.config.updates_wait_for_events && !self.wait_for_events(conn).await {
                    return err(CODE_UNKNOWN, "the plugin's connection closed".into());
                }
                let mut resp = UpdateContainersResponse::new();
                {
                    let mut st = self.state();
                    if self.inner.config.pushes_hang
                        && !super::calls::pushes_are_safe(&self.inner.config.nri_version)
                    {
                        st.errors.push(format!(
                            "UpdateContainers from the plugin on NRI {}: a real runtime before v0.12.1 hangs when such a push meets an event in progress",
                            self.inner.config.nri_version
                        ));
                    }
                    if st.fail_updates > 0 {
                        st.fail_updates -= 1;
                        resp.failed = r.update.clone();
                    }
                    st.updates.push(r);
                }
                Response {
                    payload: resp.write_to_bytes().unwrap_or_default(),
                    ..Default::default()
                }
            }
            m => err(CODE_UNIMPLEMENTED, format!("unknown method {m}")),
        }
    }

    /// Registration as the Go runtime does it: Configure goes out before the RegisterPlugin reply,
    /// then Synchronize. The plugin becomes current once configured.
    async fn register(
        &self,
        conn: &Arc<PluginConn>,
        r: RegisterPluginRequest,
    ) -> Result<(), FakeError> {
        let idx_ok = r.plugin_idx.len() == 2 && r.plugin_idx.bytes().all(|b| b.is_ascii_digit());
        if !idx_ok || r.plugin_name.is_empty() {
            return Err(FakeError::Wire(format!(
                "invalid plugin name {:?} or index {:?}",
                r.plugin_name, r.plugin_idx
            )));
        }
        {
            let mut info = conn.info.lock().unwrap_or_else(|e| e.into_inner());
            info.name = r.plugin_name.clone();
            info.index = r.plugin_idx.clone();
            info.nri_version = r.NRI_version.clone();
        }
        let cfg = &self.inner.config;
        let mut creq = ConfigureRequest::new();
        creq.config = cfg.config.clone();
        creq.runtime_name = cfg.runtime_name.clone();
        creq.runtime_version = cfg.runtime_version.clone();
        creq.registration_timeout = cfg.registration_timeout.as_millis() as i64;
        creq.request_timeout = cfg.request_timeout.as_millis() as i64;
        creq.NRI_version = cfg.nri_version.clone();
        let resp: ConfigureResponse = self
            .call_on(conn, "Configure", &creq, cfg.request_timeout)
            .await?;
        let valid = nri_mask_for(&cfg.nri_version);
        let events = resp.events as u32;
        if events & !valid != 0 {
            return Err(FakeError::Wire(format!(
                "plugin subscribed to events {events:#x} outside the valid mask {valid:#x} of NRI {}",
                cfg.nri_version
            )));
        }
        conn.info.lock().unwrap_or_else(|e| e.into_inner()).events = events;
        *self.inner.plugin.lock().unwrap_or_else(|e| e.into_inner()) = Some(conn.clone());
        // Synchronize after the RegisterPlugin reply has gone out, as the runtime does.
        let rt = self.clone();
        let c = conn.clone();
        tokio::spawn(async move {
            tokio::task::yield_now().await;
            let mut held = rt.inner.hold_sync.subscribe();
            let mut killed = c.kill.subscribe();
            tokio::select! {
                _ = held.wait_for(|h| !*h) => {}
                _ = killed.wait_for(|k| *k) => return,
            }
            match rt.synchronize(&c).await {
                Ok(()) => rt.inner.synced.send_modify(|n| *n += 1),
                Err(e) => rt.fail(&c, format!("synchronize failed: {e}")),
            }
        });
        Ok(())
    }

    /// Waits until every event request outstanding now has ended (answered, failed or timed
    /// out), as the lock of an NRI runtime before v0.12.1 makes UpdateContainers wait. Later
    /// requests do not hold it up. `false` when the connection was dropped meanwhile.
    async fn wait_for_events(&self, conn: &PluginConn) -> bool {
        let mark = conn.next_event.load(Ordering::SeqCst);
        let mut ended = conn.event_ended.subscribe();
        let mut killed = conn.kill.subscribe();
        let mut waited = false;
        loop {
            let clear = conn
                .events
                .lock()
                .unwrap_or_else(|e| e.into_inner())
                .first()
                .is_none_or(|first| *first >= mark);
            if clear {
                if waited {
                    self.state().updates_held += 1;
                }
                return true;
            }
            waited = true;
            tokio::select! {
                _ = ended.changed() => {}
                _ = killed.wait_for(|k| *k) => return false,
            }
        }
    }

    pub(super) async fn synchronize(&self, conn: &Arc<PluginConn>) -> Result<(), FakeError> {
        let chunks = {
            let st = self.state();
            encode_sync_chunks(&st.pods, &st.containers)
        };
        let n = chunks.len();
        let budget = self.inner.config.request_timeout;
        let started = tokio::time::Instant::now();
        let mut final_updates = Vec::new();
        for (i, chunk) in chunks.into_iter().enumerate() {
            let left = budget.saturating_sub(started.elapsed());
            let resp: SynchronizeResponse =
                self.call_raw(conn, "Synchronize", &chunk, left).await?;
            let last = i + 1 == n;
            if !last && (!resp.more || !resp.update.is_empty()) {
                return Err(FakeError::Wire(
                    "plugin does not handle split sync requests".into(),
                ));
            }
            if last {
                final_updates = resp.update;
            }
        }
        let mut st = self.state();
        st.sync_chunks.push(n);
        st.sync_updates.extend(final_updates);
        st.syncs += 1;
        Ok(())
    }

    pub(super) async fn call_on<Q: Message, A: Message>(
        &self,
        conn: &Arc<PluginConn>,
        method: &str,
        req: &Q,
        timeout: Duration,
    ) -> Result<A, FakeError> {
        let payload = req
            .write_to_bytes()
            .map_err(|e| FakeError::Wire(e.to_string()))?;
        self.call_raw(conn, method, &payload, timeout).await
    }

    pub(super) async fn call_raw<A: Message>(
        &self,
        conn: &Arc<PluginConn>,
        method: &str,
        payload: &[u8],
        timeout: Duration,
    ) -> Result<A, FakeError> {
        let answer = self.call_bytes(conn, method, payload, timeout).await?;
        A::parse_from_bytes(&answer)
            .map_err(|e| FakeError::Wire(format!("bad {method} reply: {e}")))
    }

    /// Sends one request and returns the encoded answer. The deadline is kept with the waiting
    /// call and enforced by the connection's watchdog ([`FakeRuntime::expire_overdue`]), rather
    /// than by a timer per call.
    pub(super) async fn call_bytes(
        &self,
        conn: &Arc<PluginConn>,
        method: &str,
        payload: &[u8],
        timeout: Duration,
    ) -> Result<Vec<u8>, FakeError> {
        let timeout_nano = timeout.as_nanos() as i64;
        let len = wire::request_len(PLUGIN_SERVICE, method, payload.len(), timeout_nano);
        if len > wire::MAX_BODY {
            return Err(FakeError::Wire(format!(
                "{method} request of {len} bytes over 4 MiB"
            )));
        }
        let sid = conn.next_stream.fetch_add(2, Ordering::Relaxed);
        // Every request but Configure is an event the runtime's lock is held for.
        let _event = (method != "Configure").then(|| EventTurn::begin(conn));
        let framed = wire::frame_request(1, sid, (PLUGIN_SERVICE, method), payload, timeout_nano);
        let (tx, rx) = oneshot::channel();
        let deadline = tokio::time::Instant::now() + timeout;
        conn.pending
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .insert(sid, Waiting { tx, deadline });
        conn.out
            .write_all(&framed)
            .await
            .map_err(|_| FakeError::Wire("connection closed".into()))?;
        let resp = match rx.await {
            Ok(Some(r)) => r,
            Err(_) => {
                return Err(FakeError::Wire(format!(
                    "connection closed during {method}"
                )));
            }
            Ok(None) => {
                let why = format!("{method} timed out");
                self.lost(conn, &why);
                return Err(FakeError::Timeout(method.into()));
            }
        };
        if resp.code == CODE_DEADLINE_EXCEEDED {
            // The plugin's ttrpc server enforces the request's timeout_nano itself; a deadline
            // error is as fatal as a missed reply.
            self.lost(
                conn,
                &format!("{method} timed out (deadline exceeded in the plugin)"),
            );
            return Err(FakeError::Timeout(method.into()));
        }
        if resp.code != 0 {
            return Err(FakeError::Status {
                method: method.into(),
                code: resp.code,
                message: resp.message,
            });
        }
        Ok(resp.payload)
    }

    /// Tells every call on `conn` whose deadline has passed that it timed out.
    pub(super) fn expire_overdue(&self, conn: &PluginConn) {
        let now = tokio::time::Instant::now();
        let mut pending = conn.pending.lock().unwrap_or_else(|e| e.into_inner());
        let overdue: Vec<u32> = pending
            .iter()
            .filter(|(_, w)| w.deadline <= now)
            .map(|(sid, _)| *sid)
            .collect();
        for sid in overdue {
            if let Some(w) = pending.remove(&sid) {
                let _ = w.tx.send(None);
            }
        }
    }
}

/// An event request in flight, for [`FakeRuntime::wait_for_events`]; ends when dropped.
struct EventTurn<'a> {
    conn: &'a PluginConn,
    order: u64,
}

impl<'a> EventTurn<'a> {
    fn begin(conn: &'a PluginConn) -> EventTurn<'a> {
        let mut events = conn.events.lock().unwrap_or_else(|e| e.into_inner());
        let order = conn.next_event.fetch_add(1, Ordering::SeqCst);
        events.insert(order);
        EventTurn { conn, order }
    }
}

impl Drop for EventTurn<'_> {
    fn drop(&mut self) {
        self.conn
            .events
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .remove(&self.order);
        self.conn.event_ended.send_modify(|n| *n += 1);
    }
}
