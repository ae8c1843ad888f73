//! `nri-accel status`: devices, shares, slices, claims, containers and the gate.

use std::path::Path;
use std::process::ExitCode;

use serde_json::Value;

use super::table::Table;
use crate::claims_api::ClaimsClient;

/// Asks the running daemon and prints a table (or the JSON document).
pub async fn run(config: &Path, json: bool) -> anyhow::Result<ExitCode> {
    let cfg = super::load_config(config)?;
    // The connect error names the socket and says what to do.
    let client = ClaimsClient::connect(&cfg.claims_api.socket).await?;
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
    // What stops grants whatever the gate says (issue 39), right under it.
    for (member, head) in [
        ("node_lock", "NODE LOCK LOST"),
        ("cdi_dir", "CDI DIR NOT IN PLACE"),
    ] {
        if let Some(problem) = doc[member]["problem"].as_str() {
            let _ = writeln!(out, "{head}: {problem}");
        }
    }
    let policy = &doc["policy"];
    let _ = writeln!(
        out,
        "shared CPUs: {}   claims: {}   pending container updates: {}",
        s(&policy["shared_cpus"]),
        s(&policy["claims"]),
        s(&doc["pending_updates"])
    );
    // The devices' UUIDs (NVIDIA GPUs), when discovery found any.
    let uuids = doc["device_uuids"].as_object().cloned().unwrap_or_default();
    let mut head = vec!["POOL", "FAMILY", "DEVICE"];
    if !uuids.is_empty() {
        head.push("UUID");
    }
    head.extend([">USED", "HOLDERS"]);
    let mut devices = Table::new(&head);
    for pool in policy["pools"].as_array().into_iter().flatten() {
        for dev in pool["devices"].as_array().into_iter().flatten() {
            let holders: Vec<String> = dev["held"]
                .as_array()
                .into_iter()
                .flatten()
                .map(|h| format!("{}[{}]", s(&h["claim"]), unit(&h["unit"])))
                .collect();
            let mut row = vec![s(&pool["name"]), s(&pool["family"]), s(&dev["id"])];
            if !uuids.is_empty() {
                row.push(
                    dev["id"]
                        .as_str()
                        .and_then(|id| uuids.get(id))
                        .map_or("-".into(), s),
                );
            }
            row.extend([
                format!("{}/{}", s(&dev["units_used"]), s(&dev["units_total"])),
                holders.join(" "),
            ]);
            devices.row(row);
        }
    }
    let _ = write!(out, "\n{}", devices.render(""));
    let claims = doc["claims"].as_array().cloned().unwrap_or_default();
    // Devices by id (what `prepare --device` and `discover` show), with the pool they are in.
    let mut table = Table::new(&["CLAIM", "ORIGIN", "DEVICES", "CONTAINERS"]);
    for c in &claims {
        let devices: Vec<String> = c["results"]
            .as_array()
            .into_iter()
            .flatten()
            .map(|g| format!("{}/{}", s(&g["pool"]), s(&g["device_id"])))
            .collect();
        let containers: Vec<String> = c["containers"]
            .as_array()
            .into_iter()
            .flatten()
            .map(|x| short(&s(x)))
            .collect();
        table.row(vec![
            s(&c["uid"]),
            s(&c["origin"]["kind"]),
            devices.join(","),
            containers.join(","),
        ]);
    }
    let _ = write!(out, "\n{}", table.render(""));
    if claims.is_empty() {
        let _ = writeln!(out, "(no claims)");
    }
    let containers = doc["containers"].as_object().cloned().unwrap_or_default();
    let _ = writeln!(out, "\ncontainers known: {}", containers.len());
    for (device, reason) in doc["device_health"]["unhealthy"]
        .as_object()
        .into_iter()
        .flatten()
    {
        let _ = writeln!(out, "UNHEALTHY device {device}: {}", s(reason));
    }
    if let Some(dra) = doc.get("kubelet").and_then(|k| k.get("dra")) {
        out.push_str(&kubelet_dra(dra));
    }
    if let Some(k) = doc.get("kubernetes") {
        out.push_str(&kubernetes(k));
    }
    if let Some(dp) = doc.get("device_plugins") {
        device_plugins(&mut out, dp);
    }
    if let Some(v) = doc.get("vendor_cdi") {
        vendor_cdi(&mut out, v);
    }
    out
}

/// The vendor CDI section (docs/gpus.md): the spec dirs read, a spec that cannot be used, and
/// each composing pool's devices with their vendor device or why they have none.
fn vendor_cdi(out: &mut String, v: &Value) {
    use std::fmt::Write;
    let dirs: Vec<String> = v["spec_dirs"]
        .as_array()
        .into_iter()
        .flatten()
        .map(s)
        .collect();
    let specs: Vec<String> = v["specs"]
        .as_array()
        .into_iter()
        .flatten()
        .map(|x| format!("{} ({})", s(&x["file"]), s(&x["kind"])))
        .collect();
    let _ = writeln!(
        out,
        "\nvendor CDI specs read from {}: {}",
        dirs.join(", "),
        if specs.is_empty() {
            "none".to_string()
        } else {
            specs.join(", ")
        }
    );
    if let Some(e) = v["error"].as_str() {
        let _ = writeln!(out, "VENDOR CDI SPEC UNUSABLE: {e}");
    }
    let mut t = Table::new(&["POOL", "DEVICE", "VENDOR DEVICE"]);
    for d in v["devices"].as_array().into_iter().flatten() {
        let vendor = match d["vendor_device"].as_str() {
            Some(n) => n.to_string(),
            None => format!("none: {}", s(&d["why"])),
        };
        t.row(vec![s(&d["pool"]), s(&d["device"]), vendor]);
    }
    let _ = write!(out, "{}", t.render(""));
}

/// The Kubernetes section: what is published, what is withdrawn, the last error.
fn kubernetes(k: &Value) -> String {
    use std::fmt::Write;
    let mut out = String::new();
    let r = &k["resource_slices"];
    let _ = writeln!(
        out,
        "\nkubernetes: driver {} on node {}, pool {}",
        s(&k["driver"]),
        s(&k["node"]),
        s(&k["pool"])
    );
    let _ = writeln!(out, "{}", on_the_server(&r["server"]));
    let _ = writeln!(
        out,
        "resource slices written: {} (generation {}), {} devices, {} counter sets, {} writes",
        s(&r["state"]),
        s(&r["generation"]),
        s(&r["devices"]),
        s(&r["counter_sets"]),
        s(&r["writes"])
    );
    for slice in r["slices"].as_array().into_iter().flatten() {
        let _ = writeln!(
            out,
            "  {:<48} {:>4} devices {:>2} counter sets",
            s(&slice["name"]),
            s(&slice["devices"]),
            s(&slice["counter_sets"])
        );
    }
    let gates: Vec<String> = r["missing_gates"]
        .as_array()
        .into_iter()
        .flatten()
        .map(s)
        .collect();
    if !gates.is_empty() {
        let _ = writeln!(
            out,
            "API server lacks feature gates: {} (see docs/dra.md for what is published instead)",
            gates.join(", ")
        );
    }
    if let Some(form) = r["numa_node_attribute"].as_str() {
        let _ = writeln!(
            out,
            "resource.kubernetes.io/numaNode published as: {form} (as the API server answered)"
        );
    }
    for w in r["withdrawn"].as_array().into_iter().flatten() {
        let claims: Vec<String> = w["claims"]
            .as_array()
            .into_iter()
            .flatten()
            .map(s)
            .collect();
        let why = match s(&w["reason"]).as_str() {
            "held-elsewhere" => match w["shares_left"].as_u64() {
                Some(left) => format!(
                    "held by claim {} through another door than DRA; {left} share(s) left published",
                    claims.join(", ")
                ),
                None => format!(
                    "held by claim {} through another door than DRA",
                    claims.join(", ")
                ),
            },
            "unhealthy" if w["taint_dropped"] == true => {
                "unhealthy; its pool asks for a taint but the API server drops taints".to_string()
            }
            other => other.to_string(),
        };
        let _ = writeln!(out, "  withdrawn: device {} ({why})", s(&w["device"]));
    }
    for t in r["tainted"].as_array().into_iter().flatten() {
        let _ = writeln!(
            out,
            "  tainted: device {} ({}, unhealthy: {})",
            s(&t["device"]),
            s(&t["effect"]),
            s(&t["reason"])
        );
    }
    if let Some(e) = r["last_error"].as_str() {
        let _ = writeln!(out, "last error ({} in a row): {e}", s(&r["failures"]));
    }
    let c = &k["claim_status"];
    match c["enabled"].as_bool() {
        Some(true) => {
            let _ = writeln!(
                out,
                "claims' status.devices: {} pending, {} written, {} cleared, {} failed",
                s(&c["pending"]),
                s(&c["written"]),
                s(&c["cleared"]),
                s(&c["failed"])
            );
            if let Some(e) = c["last_error"].as_str() {
                let _ = writeln!(out, "  last status error: {e}");
            }
        }
        Some(false) => {
            let _ = writeln!(
                out,
                "claims' status.devices: not written (dra.claim_status is off)"
            );
        }
        None => {}
    }
    out
}

/// A Unix time as `HH:MM:SS UTC`.
fn clock(unix: &Value) -> String {
    match unix.as_u64() {
        Some(t) => {
            let day = t % 86_400;
            format!(
                "{:02}:{:02}:{:02} UTC",
                day / 3600,
                day % 3600 / 60,
                day % 60
            )
        }
        None => "never".into(),
    }
}

/// What the API server holds of the node's slices, as the publisher's watch sees it.
fn on_the_server(server: &Value) -> String {
    let checked = clock(&server["checked_unix"]);
    let plural = |n: &Value, one: &str, many: &str| {
        let n = n.as_u64().unwrap_or(0);
        format!("{n} {}", if n == 1 { one } else { many })
    };
    match server["state"].as_str() {
        Some("in-sync") => format!(
            "resource slices on the server: {}, {} (generation {}, checked {checked})",
            plural(&server["slices"], "slice", "slices"),
            plural(&server["devices"], "device", "devices"),
            s(&server["generation"]),
        ),
        Some("missing") => {
            format!("resource slices MISSING on the server (checked {checked}): republishing")
        }
        Some("differs") => format!(
            "resource slices on the server DIFFER from what was published ({} missing, {} changed by someone else, {} extra; checked {checked}): republishing",
            s(&server["missing"]),
            s(&server["changed"]),
            s(&server["extra"]),
        ),
        _ => match server["error"].as_str() {
            Some(e) => format!("resource slices on the server: unknown, the watch fails: {e}"),
            None => "resource slices on the server: not known yet".to_string(),
        },
    }
}

/// The DRA driver's kubelet side: the registration's verdict and the sockets.
fn kubelet_dra(dra: &Value) -> String {
    let verdict = match dra["registration"].as_str() {
        Some("registered") => "registered by the kubelet".to_string(),
        Some("refused") => format!(
            "REFUSED by the kubelet: {} (see docs/dra-kubelet.md, troubleshooting)",
            s(&dra["reason"])
        ),
        Some("waiting") => "waiting for the kubelet to register it".to_string(),
        _ => s(&dra["registration"]),
    };
    format!(
        "\nDRA driver {} (pool {}): {verdict}\n  DRA socket {}\n  registration socket {}\n",
        s(&dra["driver"]),
        s(&dra["pool"]),
        s(&dra["endpoint"]),
        s(&dra["registration_socket"]),
    )
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
        "{:<32} {:<12} {:<22} {:>10} {:>9} {:>5}",
        "RESOURCE", "POOL", "REGISTRATION", "ADVERTISED", "AVAILABLE", "HELD"
    );
    for r in dp["resources"].as_array().into_iter().flatten() {
        let reg = &r["registration"];
        let state = s(&reg["state"]);
        let held = r["held"].as_array().cloned().unwrap_or_default();
        let _ = writeln!(
            out,
            "{:<32} {:<12} {:<22} {:>10} {:>9} {:>5}",
            s(&r["name"]),
            s(&r["pool"]),
            state,
            s(&r["advertised"]),
            s(&r["available"]),
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
        for e in r["held_elsewhere"].as_array().into_iter().flatten() {
            let _ = writeln!(
                out,
                "  not offered {}: claim {} holds it (granted outside this device plugin)",
                s(&e["id"]),
                s(&e["claim"])
            );
        }
        for u in r["unhealthy"].as_array().into_iter().flatten() {
            let _ = writeln!(out, "  UNHEALTHY {}: {}", s(&u["id"]), s(&u["reason"]));
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
