//! The minimum Rust the project states is the real one: the workspace's `rust-version` is at
//! least what every locked dependency declares (`cargo metadata --locked`), and the README says
//! the same version. A dependency update that needs a newer Rust fails here, naming it, instead
//! of failing on a user's older toolchain with a message about that crate.

use std::process::Command;

/// `1.89` or `1.88.0` as comparable numbers.
fn version(text: &str) -> Vec<u64> {
    text.split('.')
        .map(|p| {
            p.parse()
                .unwrap_or_else(|_| panic!("rust-version {text:?}"))
        })
        .collect()
}

/// Compares with missing parts as 0 (`1.88` == `1.88.0`).
fn newer(a: &[u64], b: &[u64]) -> bool {
    let n = a.len().max(b.len());
    let at = |v: &[u64], i: usize| v.get(i).copied().unwrap_or(0);
    (0..n)
        .map(|i| at(a, i).cmp(&at(b, i)))
        .find(|o| o.is_ne())
        .is_some_and(|o| o.is_gt())
}

fn host_triple(cargo_rustc: &str) -> String {
    let out = Command::new(cargo_rustc)
        .arg("-vV")
        .output()
        .expect("rustc -vV");
    String::from_utf8_lossy(&out.stdout)
        .lines()
        .find_map(|l| l.strip_prefix("host: "))
        .expect("host line")
        .to_string()
}

#[test]
fn the_workspace_rust_version_covers_every_locked_dependency() {
    let root = repo_checks::root();
    let cargo = std::env::var("CARGO").unwrap_or_else(|_| "cargo".into());
    let rustc = std::env::var("RUSTC").unwrap_or_else(|_| "rustc".into());
    // Only what builds on this platform: a Windows-only crate's rust-version does not bind us.
    let out = Command::new(&cargo)
        .args([
            "metadata",
            "--locked",
            "--format-version",
            "1",
            "--filter-platform",
        ])
        .arg(host_triple(&rustc))
        .current_dir(&root)
        .output()
        .expect("run cargo metadata");
    assert!(
        out.status.success(),
        "cargo metadata --locked failed (is Cargo.lock current?): {}",
        String::from_utf8_lossy(&out.stderr)
    );
    let doc: serde_json::Value = serde_json::from_slice(&out.stdout).expect("metadata JSON");
    let members: Vec<&str> = doc["workspace_members"]
        .as_array()
        .expect("workspace_members")
        .iter()
        .filter_map(|m| m.as_str())
        .collect();
    let packages = doc["packages"].as_array().expect("packages");
    let ours = packages
        .iter()
        .find(|p| p["name"] == "nri-accel")
        .and_then(|p| p["rust_version"].as_str())
        .expect("nri-accel declares a rust-version")
        .to_string();
    let stated = version(&ours);
    let mut too_new = Vec::new();
    for p in packages {
        let Some(needs) = p["rust_version"].as_str() else {
            continue;
        };
        let id = p["id"].as_str().unwrap_or_default();
        if members.contains(&id) {
            assert_eq!(
                needs, ours,
                "workspace member {} states rust-version {needs}, not the workspace's",
                p["name"]
            );
            continue;
        }
        if newer(&version(needs), &stated) {
            let (name, v) = (p["name"].as_str(), p["version"].as_str());
            too_new.push(format!(
                "{} {} needs Rust {needs}",
                name.unwrap_or_default(),
                v.unwrap_or_default()
            ));
        }
    }
    assert!(
        too_new.is_empty(),
        "the workspace states rust-version {ours} (Cargo.toml) but locked dependencies need more; \
         raise [workspace.package] rust-version and the README to the highest of:\n{}",
        too_new.join("\n")
    );
    let readme = std::fs::read_to_string(root.join("README.md")).expect("README.md");
    assert!(
        readme.contains(&format!("Rust stable, {ours} or newer")),
        "README.md does not state the minimum Rust {ours}"
    );
}

#[test]
fn versions_compare_by_number() {
    assert!(newer(&version("1.89"), &version("1.88")));
    assert!(newer(&version("1.100"), &version("1.99.9")));
    assert!(!newer(&version("1.88.0"), &version("1.88")));
    assert!(!newer(&version("1.87.5"), &version("1.88")));
}
