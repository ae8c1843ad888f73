//! The events the fake runtime sends to the plugin (CreateContainer, UpdateContainer,
//! StopContainer, notifications with the StateChange fallback) and the Synchronize encoding.

use nri_proto::api::*;
use nri_proto::protobuf::{Message, MessageDyn, MessageField};

use super::{CODE_UNIMPLEMENTED, FakeError, FakeRuntime};
use crate::wire;

impl FakeRuntime {
    /// Calls a plugin method on the current plugin with the 2 s request timeout.
    pub async fn call<Q: Message, A: Message>(
        &self,
        method: &str,
        req: &Q,
    ) -> Result<A, FakeError> {
        let conn = self.current()?;
        self.call_on(&conn, method, req, self.inner.config.request_timeout)
            .await
    }

    fn subscribed(&self, event: Event) -> Result<(), FakeError> {
        let events = self
            .current()?
            .info
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .events;
        let bit = 1u32 << (event as i32 - 1);
        if events == 0 || events & bit != 0 {
            Ok(())
        } else {
            Err(FakeError::NotSubscribed(event_name(event)))
        }
    }

    /// Sends CreateContainer and records the adjustment.
    pub async fn create_container(
        &self,
        pod: &PodSandbox,
        c: &Container,
    ) -> Result<CreateContainerResponse, FakeError> {
        self.create_container_encoded(&EncodedCreate::new(pod, c))
            .await
    }

    /// Sends a CreateContainer request encoded beforehand and records the adjustment: what
    /// [`FakeRuntime::create_container`] does, less encoding the pod and container again. The
    /// round-trip benchmark sends one request many times this way, so that the runtime's own
    /// protobuf encoding is not counted as plugin time.
    pub async fn create_container_encoded(
        &self,
        req: &EncodedCreate,
    ) -> Result<CreateContainerResponse, FakeError> {
        self.subscribed(Event::CREATE_CONTAINER)?;
        let conn = self.current()?;
        let timeout = self.inner.config.request_timeout;
        let raw = self
            .call_bytes(&conn, "CreateContainer", &req.payload, timeout)
            .await?;
        let resp = CreateContainerResponse::parse_from_bytes(&raw)
            .map_err(|e| FakeError::Wire(format!("bad CreateContainer reply: {e}")))?;
        if resp.adjust.is_some() {
            let id = req.container_id.clone();
            self.state().adjustments.push((id, raw));
        }
        self.replied_updates(&resp.update);
        Ok(resp)
    }

    /// Sends UpdateContainer.
    pub async fn update_container(
        &self,
        pod: &PodSandbox,
        c: &Container,
        resources: Option<LinuxResources>,
    ) -> Result<UpdateContainerResponse, FakeError> {
        self.subscribed(Event::UPDATE_CONTAINER)?;
        let mut req = UpdateContainerRequest::new();
        req.pod = MessageField::some(pod.clone());
        req.container = MessageField::some(c.clone());
        req.linux_resources = MessageField::from_option(resources);
        self.call("UpdateContainer", &req).await
    }

    /// Sends StopContainer.
    pub async fn stop_container(
        &self,
        pod: &PodSandbox,
        c: &Container,
    ) -> Result<StopContainerResponse, FakeError> {
        self.subscribed(Event::STOP_CONTAINER)?;
        let mut req = StopContainerRequest::new();
        req.pod = MessageField::some(pod.clone());
        req.container = MessageField::some(c.clone());
        let resp: StopContainerResponse = self.call("StopContainer", &req).await?;
        self.replied_updates(&resp.update);
        Ok(resp)
    }

    /// Records and applies the updates an event reply carried.
    fn replied_updates(&self, updates: &[ContainerUpdate]) {
        if updates.is_empty() {
            return;
        }
        self.state().reply_updates.extend(updates.iter().cloned());
        self.apply_updates(updates);
    }

    /// Sends a notification event (RunPodSandbox, StopPodSandbox, RemovePodSandbox,
    /// PostCreateContainer, StartContainer, PostStartContainer, PostUpdateContainer,
    /// RemoveContainer, PostUpdatePodSandbox) the way the configured NRI version does: v0.12+ calls
    /// the dedicated RPC and falls back to StateChange on Unimplemented; older runtimes send
    /// StateChange only. Returns whether the StateChange path was used.
    pub async fn notify(
        &self,
        event: Event,
        pod: &PodSandbox,
        c: Option<&Container>,
    ) -> Result<bool, FakeError> {
        self.subscribed(event)?;
        let dedicated = nri_minor(&self.inner.config.nri_version) >= 12;
        if dedicated {
            let method = method_name(event).ok_or(FakeError::NotSubscribed(event_name(event)))?;
            // Every notification request is {pod = 1, container = 2}: encode it as the container form.
            let mut req = PostCreateContainerRequest::new();
            req.pod = MessageField::some(pod.clone());
            req.container = MessageField::from_option(c.cloned());
            match self.call::<_, Empty>(method, &req).await {
                Ok(_) => return Ok(false),
                Err(FakeError::Status {
                    code: CODE_UNIMPLEMENTED,
                    ..
                }) => {}
                Err(e) => return Err(e),
            }
        }
        let mut ev = StateChangeEvent::new();
        ev.event = event.into();
        ev.pod = MessageField::some(pod.clone());
        ev.container = MessageField::from_option(c.cloned());
        self.call::<_, Empty>("StateChange", &ev).await?;
        Ok(true)
    }

    /// Sends Synchronize again with the current pods and containers.
    pub async fn resynchronize(&self) -> Result<(), FakeError> {
        let conn = self.current()?;
        self.synchronize(&conn).await?;
        self.inner.synced.send_modify(|n| *n += 1);
        Ok(())
    }
}

/// A CreateContainer request, encoded (see [`FakeRuntime::create_container_encoded`]).
pub struct EncodedCreate {
    container_id: String,
    payload: Vec<u8>,
}

impl EncodedCreate {
    /// Encodes the request for `c` in `pod`.
    pub fn new(pod: &PodSandbox, c: &Container) -> EncodedCreate {
        EncodedCreate {
            container_id: c.id.clone(),
            payload: encode_pod_container(pod, c),
        }
    }
}

/// Encodes `{pod = 1, container = 2}`, the shape of CreateContainerRequest and the other
/// per-container requests, straight from the borrowed messages (no copies of them).
fn encode_pod_container(pod: &PodSandbox, c: &Container) -> Vec<u8> {
    // Sized exactly, so that a request of a few hundred bytes is one small allocation.
    let (pod_len, c_len) = (pod.compute_size(), c.compute_size());
    let field = |n: u64| 1 + protobuf::rt::compute_raw_varint64_size(n) + n;
    let mut out = Vec::with_capacity((field(pod_len) + field(c_len)) as usize);
    let mut os = protobuf::CodedOutputStream::vec(&mut out);
    // Encoding into a Vec cannot fail; the sizes were just computed (and cached) above.
    let _ = os.write_raw_varint32(0x0A); // field 1, length-delimited
    let _ = os.write_raw_varint64(pod_len);
    let _ = pod.write_to_with_cached_sizes(&mut os);
    let _ = os.write_raw_varint32(0x12); // field 2, length-delimited
    let _ = os.write_raw_varint64(c_len);
    let _ = c.write_to_with_cached_sizes(&mut os);
    let _ = os.flush();
    drop(os);
    out
}

/// Encodes the Synchronize requests for `pods` and `containers`: one message when it fits the
/// 4 MiB ttrpc limit, otherwise chunks that each fit, with `more = true` on all but the last (as
/// the runtime does after ResourceExhausted). Items are encoded straight from the slices.
pub fn encode_sync_chunks(pods: &[PodSandbox], containers: &[Container]) -> Vec<Vec<u8>> {
    const LIMIT: usize = wire::MAX_BODY - 64 * 1024;
    const POD_TAG: u8 = 0x0A; // field 1, length-delimited
    const CONTAINER_TAG: u8 = 0x12; // field 2, length-delimited
    const MORE_TRUE: [u8; 2] = [0x18, 0x01]; // field 3, varint 1
    let mut chunks = Vec::new();
    let mut cur = Vec::with_capacity(1 << 20);
    let items = pods.iter().map(|p| (POD_TAG, p as &dyn MessageDyn)).chain(
        containers
            .iter()
            .map(|c| (CONTAINER_TAG, c as &dyn MessageDyn)),
    );
    let mut item = Vec::new();
    for (tag, m) in items {
        item.clear();
        item.push(tag);
        // Encoding into a Vec cannot fail.
        let _ = m.write_length_delimited_to_vec_dyn(&mut item);
        if !cur.is_empty() && cur.len() + item.len() + MORE_TRUE.len() > LIMIT {
            cur.extend_from_slice(&MORE_TRUE);
            chunks.push(std::mem::take(&mut cur));
        }
        cur.extend_from_slice(&item);
    }
    chunks.push(cur);
    chunks
}

/// Whether NRI version `v` has the fix for plugin pushes during events (v0.12.1, nri#301).
pub(super) fn pushes_are_safe(v: &str) -> bool {
    let v = v.trim_start_matches('v');
    let mut it = v.split(|c: char| !c.is_ascii_digit());
    let mut next = || it.next().and_then(|s| s.parse::<u32>().ok()).unwrap_or(0);
    (next(), next(), next()) >= (0, 12, 1)
}

fn nri_minor(v: &str) -> u32 {
    let v = v.trim_start_matches('v');
    let mut it = v.split('.');
    let major: u32 = it.next().and_then(|s| s.parse().ok()).unwrap_or(0);
    let minor: u32 = it.next().and_then(|s| s.parse().ok()).unwrap_or(0);
    if major > 0 { u32::MAX } else { minor }
}

/// The event mask a runtime of NRI version `v` accepts (its own reading of the rule).
pub fn nri_mask_for(v: &str) -> u32 {
    if nri_minor(v) >= 10 { 0x3FFF } else { 0x7FF }
}

fn method_name(e: Event) -> Option<&'static str> {
    Some(match e {
        Event::RUN_POD_SANDBOX => "RunPodSandbox",
        Event::STOP_POD_SANDBOX => "StopPodSandbox",
        Event::REMOVE_POD_SANDBOX => "RemovePodSandbox",
        Event::POST_CREATE_CONTAINER => "PostCreateContainer",
        Event::START_CONTAINER => "StartContainer",
        Event::POST_START_CONTAINER => "PostStartContainer",
        Event::POST_UPDATE_CONTAINER => "PostUpdateContainer",
        Event::REMOVE_CONTAINER => "RemoveContainer",
        Event::POST_UPDATE_POD_SANDBOX => "PostUpdatePodSandbox",
        _ => return None,
    })
}

fn event_name(e: Event) -> &'static str {
    method_name(e).unwrap_or(match e {
        Event::CREATE_CONTAINER => "CreateContainer",
        Event::UPDATE_CONTAINER => "UpdateContainer",
        Event::STOP_CONTAINER => "StopContainer",
        _ => "event",
    })
}
