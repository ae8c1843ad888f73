//! Shared set-up for the claims API tests over the real socket: the real engine on a small
//! simulated node (`engine_common`), its agent with the gate open, and a client.
#![allow(dead_code, missing_docs)]

use std::sync::Arc;
use std::time::Duration;

use nri_accel::claims_api::{ClaimsClient, ClaimsServer, ServerOptions};
use nri_accel::daemon::{Agent, AgentSettings, ClaimsFacade};
use nri_accel::gate::Gate;
use nri_accel::metrics::Metrics;

use crate::engine_common::{Dirs, dirs, open_with};

/// Guards against a hang only; no assertion depends on how long anything takes.
pub const HANG_GUARD: Duration = Duration::from_secs(60);

/// A claims API served on a real socket in temp dirs.
pub struct ClaimsNode {
    pub d: Dirs,
    pub agent: Arc<Agent>,
    pub client: ClaimsClient,
    pub _server: ClaimsServer,
}

/// Serves the claims API over an engine with `devices` devices, its gate open.
pub async fn serve(devices: usize) -> ClaimsNode {
    let d = dirs();
    let (engine, _) = open_with(&d, devices, 0, None).unwrap();
    let agent = Arc::new(Agent::new(
        Arc::new(engine),
        AgentSettings {
            cdi_kind: "accel.nri.io/device".into(),
            annotation_prefix: "accel.nri.io".into(),
        },
    ));
    drop(agent.sync_started());
    let gate = Gate::new();
    gate.open();
    let facade = ClaimsFacade::new(agent.clone(), Arc::new(Metrics::new())).with_gate(gate.clone());
    let path = d.state.join("claims.sock");
    let server = ClaimsServer::bind(&path, Arc::new(facade), gate, ServerOptions::default())
        .await
        .unwrap();
    let client = ClaimsClient::connect(&path)
        .await
        .unwrap()
        .with_timeout(HANG_GUARD);
    ClaimsNode {
        d,
        agent,
        client,
        _server: server,
    }
}
