//! `nri-accel status`: devices, shares, slices, claims, containers and the gate.

use std::path::Path;
use std::process::ExitCode;

use anyhow::Context;
use serde_json::Value;

use crate::claims_api::ClaimsClient;

/// Asks the running daemon and prints a table (or the JSON document).
pub async fn run(config: &Path, json: bool) -> anyhow::Result<ExitCode> {
    let cfg = super::load_config(config)?;
    let socket = cfg.claims_api.socket;
    let client = ClaimsClient::connect(&socket).await.with_context(|| {
        format!(
            "connecting to the claims API at {} (is nri-accel running?)",
            socket.display()
        )
    })?;
    let report = client.status().await?;
    if json {
        println!("{}", serde_json::to_string_pretty(&report.document)?);
    } else {
        print!("{}", render(&report.document));
    }
    Ok(ExitCode::SUCCESS)
}

fn s(v: &Value) -> String {
    match v {
        Value::String(s) => s.clone(),
        Value::Null => "-".into(),
        other => other.to_string(),
    }
}

/// The human-readable form of the status document.
pub fn render(doc: &Value) -> String {
    use std::fmt::Write;
    let mut out = String::new();
    let gate = match doc.get("gate") {
        Some(Value::Object(g)) if g.get("open") == Some(&Value::Bool(true)) => "open".to_string(),
        Some(Value::Object(_)) => "closed (waiting for the runtime's Synchronize)".to_string(),
        Some(v) => s(v),
        None => "-".to_string(),
    };
    let _ = writeln!(out, "gate: {gate}");
    let policy = &doc["policy"];
    let _ = writeln!(
        out,
        "shared CPUs: {}   claims: {}   pending container updates: {}",
        s(&policy["shared_cpus"]),
        s(&policy["claims"]),
        s(&doc["pending_updates"])
    );
    let _ = writeln!(
        out,
        "\n{:<12} {:<10} {:<16} {:>6}  holders",
        "POOL", "FAMILY", "DEVICE", "USED"
    );
    for pool in policy["pools"].as_array().into_iter().flatten() {
        for dev in pool["devices"].as_array().into_iter().flatten() {
            let holders: Vec<String> = dev["held"]
                .as_array()
                .into_iter()
                .flatten()
                .map(|h| format!("{}[{}]", s(&h["claim"]), unit(&h["unit"])))
                .collect();
            let _ = writeln!(
                out,
                "{:<12} {:<10} {:<16} {:>3}/{:<2}  {}",
                s(&pool["name"]),
                s(&pool["family"]),
                s(&dev["id"]),
                s(&dev["units_used"]),
                s(&dev["units_total"]),
                holders.join(" ")
            );
        }
    }
    let claims = doc["claims"].as_array().cloned().unwrap_or_default();
    let _ = writeln!(
        out,
        "\n{:<40} {:<14} {:<28} containers",
        "CLAIM", "ORIGIN", "DEVICES"
    );
    for c in &claims {
        let devices: Vec<String> = c["results"]
            .as_array()
            .into_iter()
            .flatten()
            .map(|g| s(&g["device"]))
            .collect();
        let containers: Vec<String> = c["containers"]
            .as_array()
            .into_iter()
            .flatten()
            .map(|x| short(&s(x)))
            .collect();
        let _ = writeln!(
            out,
            "{:<40} {:<14} {:<28} {}",
            s(&c["uid"]),
            s(&c["origin"]["kind"]),
            devices.join(","),
            containers.join(",")
        );
    }
    if claims.is_empty() {
        let _ = writeln!(out, "(no claims)");
    }
    let containers = doc["containers"].as_object().cloned().unwrap_or_default();
    let _ = writeln!(out, "\ncontainers known: {}", containers.len());
    if let Some(dp) = doc.get("device_plugins") {
        device_plugins(&mut out, dp);
    }
    out
}

/// The device plugins part: each resource, its registration, what it advertises and holds.
fn device_plugins(out: &mut String, dp: &Value) {
    use std::fmt::Write;
    let present = if dp["kubelet_socket_present"] == Value::Bool(true) {
        "present"
    } else {
        "absent"
    };
    let _ = writeln!(
        out,
        "\ndevice plugins (kubelet socket {}: {present})",
        s(&dp["kubelet_socket"])
    );
    let _ = writeln!(
        out,
        "{:<32} {:<12} {:<22} {:>10} {:>7} {:>5}",
        "RESOURCE", "POOL", "REGISTRATION", "ADVERTISED", "HEALTHY", "HELD"
    );
    for r in dp["resources"].as_array().into_iter().flatten() {
        let reg = &r["registration"];
        let state = s(&reg["state"]);
        let held = r["held"].as_array().cloned().unwrap_or_default();
        let _ = writeln!(
            out,
            "{:<32} {:<12} {:<22} {:>10} {:>7} {:>5}",
            s(&r["name"]),
            s(&r["pool"]),
            state,
            s(&r["advertised"]),
            s(&r["healthy"]),
            held.len()
        );
        if let Some(reason) = reg["reason"].as_str() {
            let _ = writeln!(out, "  registration failed: {reason}");
        }
        for h in &held {
            let containers: Vec<String> = h["containers"]
                .as_array()
                .into_iter()
                .flatten()
                .map(|c| short(&s(c)))
                .collect();
            let users = if containers.is_empty() {
                "no container yet".to_string()
            } else {
                format!("container {}", containers.join(","))
            };
            let _ = writeln!(
                out,
                "  held {} by claim {} ({users}, pod {})",
                s(&h["id"]),
                s(&h["claim"]),
                s(&h["pod"])
            );
        }
        for u in r["unhealthy"].as_array().into_iter().flatten() {
            let _ = writeln!(out, "  unhealthy {}: {}", s(&u["id"]), s(&u["reason"]));
        }
    }
}

fn unit(u: &Value) -> String {
    match u["kind"].as_str() {
        Some("share") => format!("share {}", s(&u["index"])),
        Some("slice") => format!("{}@{}", s(&u["profile"]), s(&u["start"])),
        Some(k) => k.to_string(),
        None => s(u),
    }
}

fn short(id: &str) -> String {
    id.chars().take(12).collect()
}
