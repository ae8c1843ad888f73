//! `nri-accel prepare` / `unprepare`: claims through the running daemon's claims API.

use std::path::Path;
use std::process::ExitCode;

use serde_json::Value;

use crate::claims_api::{ClaimAsk, ClaimRef, ClaimSpec, ClaimsClient, CountAsk, Family, Selector};

/// What `prepare` asks for.
pub struct CountArgs {
    /// Devices wanted.
    pub count: u32,
    /// Family name.
    pub family: Option<String>,
    /// Vendor.
    pub vendor: Option<String>,
    /// Slice profile.
    pub profile: Option<String>,
    /// Device ids, or the published names `status` shows.
    pub devices: Vec<String>,
    /// The request's name in refusals and records; by default the ask itself.
    pub request: Option<String>,
}

impl CountArgs {
    /// The request name when none is given: what was asked, as the refusal will repeat it
    /// (`count=1,family=sliced,profile=1g`), rather than a name the operator never chose.
    fn default_request(&self) -> String {
        let mut parts = vec![format!("count={}", self.count)];
        let named = [
            ("family", &self.family),
            ("vendor", &self.vendor),
            ("profile", &self.profile),
        ];
        for (key, value) in named {
            if let Some(v) = value {
                parts.push(format!("{key}={v}"));
            }
        }
        for d in &self.devices {
            parts.push(format!("device={d}"));
        }
        parts.join(",")
    }
}

async fn client(config: &Path) -> anyhow::Result<ClaimsClient> {
    let cfg = super::load_config(config)?;
    // The error names the socket and says what to do.
    Ok(ClaimsClient::connect(&cfg.claims_api.socket).await?)
}

/// Device ids for `--device` values: an id is kept; `<pool>/<id>` (what `status` lists under a
/// claim) and the published name of a whole device (`<pool>-<id>`, what a DRA driver sees)
/// become the id.
fn resolve_devices(wanted: &[String], status: &Value) -> Vec<String> {
    let mut named = std::collections::BTreeMap::new();
    for pool in status["policy"]["pools"].as_array().into_iter().flatten() {
        let pool_name = pool["name"].as_str().unwrap_or_default();
        for dev in pool["devices"].as_array().into_iter().flatten() {
            if let Some(id) = dev["id"].as_str() {
                named.insert(policies::naming::device_name(pool_name, id), id.to_string());
                named.insert(format!("{pool_name}/{id}"), id.to_string());
                named.insert(id.to_string(), id.to_string());
            }
        }
    }
    wanted
        .iter()
        .map(|w| named.get(w).cloned().unwrap_or_else(|| w.clone()))
        .collect()
}

/// Prepares one claim and prints its CDI device IDs.
pub async fn prepare(
    config: &Path,
    uid: String,
    namespace: String,
    name: Option<String>,
    args: CountArgs,
) -> anyhow::Result<ExitCode> {
    // Any other name is a policy an author registered (`kind: custom` pools); the daemon
    // refuses it per claim when no pool has that family.
    let family = match args.family.as_deref() {
        None | Some("exclusive") => Family::Exclusive,
        Some("shared") => Family::Shared,
        Some("sliced") => Family::Sliced,
        Some(other) => Family::Custom(other.to_string()),
    };
    let client = client(config).await?;
    let device_ids = if args.devices.is_empty() {
        Vec::new()
    } else {
        resolve_devices(&args.devices, &client.status().await?.document)
    };
    let request = args
        .request
        .clone()
        .unwrap_or_else(|| args.default_request());
    let spec = ClaimSpec {
        name: name.unwrap_or_else(|| uid.clone()),
        uid: uid.clone(),
        namespace,
        ask: ClaimAsk::Count(vec![CountAsk {
            request,
            count: args.count,
            family,
            selector: Selector {
                vendor: args.vendor,
                device_ids,
                ..Selector::default()
            },
            profile: args.profile,
            shares: None,
        }]),
        env: Default::default(),
    };
    let answer = client.prepare(vec![spec]).await?;
    match answer.get(&uid) {
        Some(Ok(devices)) => {
            for d in devices {
                println!("{} {} {}", d.pool, d.device, d.cdi_device_ids.join(","));
            }
            Ok(ExitCode::SUCCESS)
        }
        Some(Err(e)) => {
            eprintln!("{e}");
            Ok(ExitCode::from(1))
        }
        None => anyhow::bail!(
            "the daemon answered without a result for claim {uid}; see its log (journalctl -u \
             nri-accel) and retry"
        ),
    }
}

/// Releases one claim; a claim the node does not hold is said to be so (releasing it is still a
/// success, as the claims API answers).
pub async fn unprepare(config: &Path, uid: String) -> anyhow::Result<ExitCode> {
    let client = client(config).await?;
    let held = client.list().await?.iter().any(|c| c.uid == uid);
    let answer = client
        .unprepare(vec![ClaimRef {
            uid: uid.clone(),
            namespace: String::new(),
            name: String::new(),
        }])
        .await?;
    match answer.get(&uid) {
        Some(Ok(())) if held => {
            println!("claim {uid} released");
            Ok(ExitCode::SUCCESS)
        }
        Some(Ok(())) => {
            println!("claim {uid} is not prepared on this node: nothing to release");
            Ok(ExitCode::SUCCESS)
        }
        Some(Err(e)) => {
            eprintln!("{e}");
            Ok(ExitCode::from(1))
        }
        None => anyhow::bail!(
            "the daemon answered without a result for claim {uid}; see its log (journalctl -u \
             nri-accel) and retry"
        ),
    }
}
