//! The fake runtime's side of one plugin connection: socket reader and writer, the Go-style
//! conn readers, the runtime service (RegisterPlugin, UpdateContainers), registration with
//! Configure and Synchronize, and plugin calls with the request timeout.

use std::collections::HashMap;
use std::sync::atomic::{AtomicU32, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use nri_proto::api::*;
use nri_proto::protobuf::Message;
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::UnixStream;
use tokio::sync::{mpsc, oneshot, watch};

use super::calls::{encode_sync_chunks, nri_mask_for};
use super::{
    CODE_DEADLINE_EXCEEDED, CODE_UNIMPLEMENTED, CODE_UNKNOWN, FakeError, FakeRuntime,
    PLUGIN_SERVICE, PluginConn, PluginInfo, RUNTIME_SERVICE,
};
use crate::wire::{self, GoConnReader, Request, Response};

impl FakeRuntime {
    /// Serves one plugin connection.
    pub(super) fn attach(&self, stream: UnixStream) {
        let (kill, _) = watch::channel(false);
        let (out, mut out_rx) = mpsc::unbounded_channel::<Vec<u8>>();
        let conn = Arc::new(PluginConn {
            info: Mutex::new(PluginInfo::default()),
            out,
            pending: Mutex::new(HashMap::new()),
            next_stream: AtomicU32::new(1),
            kill,
        });
        let (mut rd, mut wr) = stream.into_split();
        let (tx1, rx1) = mpsc::unbounded_channel();
        let (tx2, rx2) = mpsc::unbounded_channel();
        let rt = self.clone();
        let mut killed = conn.kill.subscribe();
        let c = conn.clone();
        tokio::spawn(async move {
            let writer = async {
                while let Some(b) = out_rx.recv().await {
                    if wr.write_all(&b).await.is_err() {
                        break;
                    }
                }
            };
            let reader = async {
                let mut h = [0u8; wire::FRAME_HEADER];
                loop {
                    if rd.read_exact(&mut h).await.is_err() {
                        return "plugin closed the connection".to_string();
                    }
                    let id = u32::from_be_bytes([h[0], h[1], h[2], h[3]]);
                    let len = u32::from_be_bytes([h[4], h[5], h[6], h[7]]) as usize;
                    if len > wire::MAX_FRAME {
                        return format!("frame of {len} bytes over the limit");
                    }
                    let mut p = vec![0u8; len];
                    if rd.read_exact(&mut p).await.is_err() {
                        return "truncated frame".to_string();
                    }
                    {
                        let mut st = rt.state();
                        st.max_plugin_frame = st.max_plugin_frame.max(len);
                    }
                    let _ = match id {
                        1 => tx1.send(p),
                        2 => tx2.send(p),
                        _ => Ok(()),
                    };
                }
            };
            let why = tokio::select! {
                _ = writer => "write failed".to_string(),
                w = reader => w,
                _ = killed.wait_for(|k| *k) => "dropped by the runtime".to_string(),
            };
            rt.lost(&c, &why);
        });
        let rt = self.clone();
        let c = conn.clone();
        tokio::spawn(async move { rt.read_responses(c, GoConnReader::new(rx1)).await });
        let rt = self.clone();
        let c = conn.clone();
        tokio::spawn(async move { rt.serve_runtime(c, GoConnReader::new(rx2)).await });
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

    pub(super) fn lost(&self, conn: &Arc<PluginConn>, why: &str) {
        conn.kill.send_replace(true);
        conn.pending
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .clear();
        let mut cur = self.inner.plugin.lock().unwrap_or_else(|e| e.into_inner());
        if cur.as_ref().is_some_and(|p| Arc::ptr_eq(p, conn)) {
            *cur = None;
            drop(cur);
            self.state().errors.push(why.to_string());
        }
    }

    async fn read_responses(&self, conn: Arc<PluginConn>, mut rd: GoConnReader) {
        loop {
            let msg = rd.read_message().await;
            let (sid, kind, body) = match msg {
                Ok(m) => m,
                Err(e) => {
                    self.fail(&conn, format!("conn 1: {e}"));
                    return;
                }
            };
            if kind != wire::TYPE_RESPONSE {
                self.fail(&conn, format!("conn 1: unexpected message type {kind}"));
                return;
            }
            let resp = match Response::decode(&body) {
                Ok(r) => r,
                Err(e) => {
                    self.fail(&conn, format!("conn 1: {e}"));
                    return;
                }
            };
            let tx = conn
                .pending
                .lock()
                .unwrap_or_else(|e| e.into_inner())
                .remove(&sid);
            if let Some(tx) = tx {
                let _ = tx.send(resp);
            }
        }
    }

    fn fail(&self, conn: &Arc<PluginConn>, why: String) {
        if why.ends_with("connection closed") {
            return;
        }
        self.state().errors.push(why.clone());
        self.lost(conn, &why);
    }

    async fn serve_runtime(&self, conn: Arc<PluginConn>, mut rd: GoConnReader) {
        let mut last_sid = 0u32;
        loop {
            let (sid, kind, body) = match rd.read_message().await {
                Ok(m) => m,
                Err(e) => return self.fail(&conn, format!("conn 2: {e}")),
            };
            if kind != wire::TYPE_REQUEST || sid % 2 == 0 || sid <= last_sid {
                return self.fail(&conn, format!("conn 2: bad stream id {sid} or type {kind}"));
            }
            last_sid = sid;
            let req = match Request::decode(&body) {
                Ok(r) => r,
                Err(e) => return self.fail(&conn, format!("conn 2: {e}")),
            };
            let rt = self.clone();
            let c = conn.clone();
            tokio::spawn(async move {
                let resp = rt.handle_runtime_call(&c, req).await;
                let _ = c.out.send(wire::frame_message(
                    2,
                    sid,
                    wire::TYPE_RESPONSE,
                    &resp.encode(),
                ));
            });
        }
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
                let mut resp = UpdateContainersResponse::new();
                {
                    let mut st = self.state();
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
            match rt.synchronize(&c).await {
                Ok(()) => rt.inner.synced.send_modify(|n| *n += 1),
                Err(e) => rt.fail(&c, format!("synchronize failed: {e}")),
            }
        });
        Ok(())
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
            let resp: SynchronizeResponse = self.call_raw(conn, "Synchronize", chunk, left).await?;
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
        self.call_raw(conn, method, payload, timeout).await
    }

    async fn call_raw<A: Message>(
        &self,
        conn: &Arc<PluginConn>,
        method: &str,
        payload: Vec<u8>,
        timeout: Duration,
    ) -> Result<A, FakeError> {
        let body = Request {
            service: PLUGIN_SERVICE.into(),
            method: method.into(),
            payload,
            timeout_nano: timeout.as_nanos() as i64,
        }
        .encode();
        if body.len() > wire::MAX_BODY {
            return Err(FakeError::Wire(format!(
                "{method} request of {} bytes over 4 MiB",
                body.len()
            )));
        }
        let sid = conn.next_stream.fetch_add(2, Ordering::Relaxed);
        let (tx, rx) = oneshot::channel();
        conn.pending
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .insert(sid, tx);
        conn.out
            .send(wire::frame_message(1, sid, wire::TYPE_REQUEST, &body))
            .map_err(|_| FakeError::Wire("connection closed".into()))?;
        let resp = match tokio::time::timeout(timeout, rx).await {
            Ok(Ok(r)) => r,
            Ok(Err(_)) => {
                return Err(FakeError::Wire(format!(
                    "connection closed during {method}"
                )));
            }
            Err(_) => {
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
        A::parse_from_bytes(&resp.payload)
            .map_err(|e| FakeError::Wire(format!("bad {method} reply: {e}")))
    }
}
