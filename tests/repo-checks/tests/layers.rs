//! The plugin's layers stay visible and enforced (docs/architecture.md, "Layers"): the claim core
//! (engine, checkpoint, gate, allocator, device health) imports none of the adapters around it
//! (nor the daemon's startup checks or the simulated node), the modules under both (config,
//! discovery, ...) import neither, and in no crate of the workspace do two files import each
//! other, directly or around a loop. A new such import fails here, naming the files; a new
//! top-level module of the plugin fails until it is given a layer.

use std::path::{Path, PathBuf};
use std::process::Command;

use repo_checks::imports::Graph;

/// The claim core: what allocates, commits and proves a grant. Top-level modules of the plugin.
const CORE: [&str; 5] = ["engine", "checkpoint", "gate", "allocator", "device_health"];

/// What every layer reads: these import neither the core nor the outer layer.
const BASE: [&str; 11] = [
    "config",
    "discovery",
    "vendor",
    "check",
    "names",
    "metrics",
    "logging",
    "nodelock",
    "notify",
    "bootid",
    "privileges",
];

/// The outer layer, with what each is: the adapters that turn a door's calls into engine calls,
/// the daemon's startup checks (they know where the checkpoint lives), and the simulated node
/// the tests and the demo build on.
const OUTER: [(&str, &str); 8] = [
    ("daemon", "the NRI daemon"),
    ("claims_api", "the claims API"),
    ("kubelet", "the kubelet's DRA and device plugin services"),
    ("kube", "the Kubernetes API side"),
    ("cli", "the command line"),
    ("webhook", "the validating admission webhook"),
    ("preflight", "the daemon's startup checks"),
    ("fixtures", "the simulated node of the demo and tests"),
];

/// The root file of every library and binary in the workspace, from `cargo metadata`.
fn crate_roots() -> Vec<PathBuf> {
    let cargo = std::env::var("CARGO").unwrap_or_else(|_| "cargo".into());
    let out = Command::new(cargo)
        .args(["metadata", "--no-deps", "--format-version", "1"])
        .current_dir(repo_checks::root())
        .output()
        .expect("run cargo metadata");
    assert!(
        out.status.success(),
        "cargo metadata: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    let doc: serde_json::Value = serde_json::from_slice(&out.stdout).expect("metadata JSON");
    let mut roots = Vec::new();
    for package in doc["packages"].as_array().expect("packages") {
        for target in package["targets"].as_array().expect("targets") {
            let kinds = target["kind"].as_array().expect("kind");
            if kinds.iter().any(|k| k == "lib" || k == "bin") {
                roots.push(PathBuf::from(
                    target["src_path"].as_str().expect("src_path"),
                ));
            }
        }
    }
    roots.sort();
    assert!(
        roots.len() >= 10,
        "only {} crate roots: {roots:?}",
        roots.len()
    );
    roots
}

fn shown(path: &Path) -> String {
    let root = repo_checks::root().canonicalize().expect("root");
    let path = &path.canonicalize().unwrap_or_else(|_| path.to_path_buf());
    path.strip_prefix(&root)
        .unwrap_or(path)
        .display()
        .to_string()
}

#[test]
fn each_layer_imports_only_the_layers_under_it() {
    let lib = repo_checks::root().join("plugin/src/lib.rs");
    let g = Graph::load(&lib);
    let top = |m: &[String]| m.first().cloned().unwrap_or_default();
    let outer = |m: &str| OUTER.iter().find(|(a, _)| *a == m).map(|(_, what)| *what);
    let mut bad = Vec::new();
    for i in &g.imports {
        let (from, to) = (top(&g.files[i.from].module), top(&i.path));
        let why = if CORE.contains(&from.as_str()) {
            outer(&to).map(|what| format!("the claim core imports {what}"))
        } else if BASE.contains(&from.as_str()) {
            outer(&to)
                .map(|what| format!("a module under the core imports {what}"))
                .or_else(|| {
                    CORE.contains(&to.as_str())
                        .then(|| "a module under the core imports the core".to_string())
                })
        } else {
            None
        };
        if let Some(why) = why {
            bad.push(format!(
                "{} imports crate::{}: {why}",
                shown(&g.files[i.from].path),
                i.path.join("::")
            ));
        }
    }
    // Every top-level module has a layer, and every module named here exists: a new or renamed
    // module must be placed here, not silently pass.
    let named: Vec<&str> = CORE
        .iter()
        .chain(BASE.iter())
        .chain(OUTER.iter().map(|(m, _)| m))
        .copied()
        .collect();
    let modules: Vec<String> = g
        .files
        .iter()
        .filter(|f| f.module.len() == 1)
        .map(|f| top(&f.module))
        .collect();
    for m in &modules {
        assert!(
            named.contains(&m.as_str()),
            "plugin/src has a module {m} of no layer: add it to CORE, BASE or OUTER in this \
             test (and to docs/architecture.md, \"Layers\")"
        );
    }
    for m in &named {
        assert!(
            modules.iter().any(|x| x == m),
            "plugin/src has no module {m}: update the layer lists in this test"
        );
    }
    assert!(
        bad.is_empty(),
        "imports against the layers (docs/architecture.md, \"Layers\"); move what both need \
         into the lower layer:\n{}",
        bad.join("\n")
    );
}

#[test]
fn no_two_files_import_each_other_in_any_crate() {
    let mut cycles = Vec::new();
    let mut files = 0;
    for root in crate_roots() {
        let g = Graph::load(&root);
        files += g.files.len();
        for cycle in g.cycles() {
            let names: Vec<String> = cycle.iter().map(|p| shown(p)).collect();
            cycles.push(names.join(" -> "));
        }
    }
    cycles.sort();
    cycles.dedup();
    assert!(files > 150, "only {files} files read");
    assert!(
        cycles.is_empty(),
        "files that import each other (move the shared item to a file both can import, or to \
         the module that owns it):\n{}",
        cycles.join("\n")
    );
}
