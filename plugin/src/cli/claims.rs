//! `nri-accel prepare` / `unprepare`: claims through the running daemon's claims API.

use std::path::Path;
use std::process::ExitCode;

use anyhow::Context;

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
    /// Device ids.
    pub devices: Vec<String>,
}

async fn client(config: &Path) -> anyhow::Result<ClaimsClient> {
    let cfg = super::load_config(config)?;
    let socket = cfg.claims_api.socket;
    ClaimsClient::connect(&socket).await.with_context(|| {
        format!(
            "connecting to the claims API at {} (is nri-accel running?)",
            socket.display()
        )
    })
}

/// Prepares one claim and prints its CDI device IDs.
pub async fn prepare(
    config: &Path,
    uid: String,
    namespace: String,
    name: Option<String>,
    args: CountArgs,
) -> anyhow::Result<ExitCode> {
    let family = match args.family.as_deref() {
        None | Some("exclusive") => Family::Exclusive,
        Some("shared") => Family::Shared,
        Some("sliced") => Family::Sliced,
        Some(other) => anyhow::bail!("--family {other:?} is not one of exclusive, shared, sliced"),
    };
    let spec = ClaimSpec {
        name: name.unwrap_or_else(|| uid.clone()),
        uid: uid.clone(),
        namespace,
        ask: ClaimAsk::Count(vec![CountAsk {
            request: "cli".into(),
            count: args.count,
            family,
            selector: Selector {
                vendor: args.vendor,
                device_ids: args.devices,
                ..Selector::default()
            },
            profile: args.profile,
            shares: None,
        }]),
    };
    let answer = client(config).await?.prepare(vec![spec]).await?;
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
        None => anyhow::bail!("the daemon did not answer for claim {uid}"),
    }
}

/// Releases one claim.
pub async fn unprepare(config: &Path, uid: String) -> anyhow::Result<ExitCode> {
    let answer = client(config)
        .await?
        .unprepare(vec![ClaimRef {
            uid: uid.clone(),
            namespace: String::new(),
            name: String::new(),
        }])
        .await?;
    match answer.get(&uid) {
        Some(Ok(())) => {
            println!("claim {uid} released");
            Ok(ExitCode::SUCCESS)
        }
        Some(Err(e)) => {
            eprintln!("{e}");
            Ok(ExitCode::from(1))
        }
        None => anyhow::bail!("the daemon did not answer for claim {uid}"),
    }
}
