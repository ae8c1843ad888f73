//! The binary that ships (the .deb, the image) links no simulator: `cargo tree -p nri-accel -e
//! normal` lists neither nri-sim nor kube-sim, nor the demo built on them (they are the plugin's
//! dev-dependencies and the demo crate's normal ones). And the three crates the plugin wires
//! together stay apart, as the design card draws them: none of nri-proto, cdi and policies
//! depends on another.

use std::process::Command;

/// The packages `cargo tree` lists for `package`'s normal dependencies, each once.
fn normal_tree(package: &str) -> Vec<String> {
    let cargo = std::env::var("CARGO").unwrap_or_else(|_| "cargo".into());
    let out = Command::new(cargo)
        .args(["tree", "-p", package, "-e", "normal", "--prefix", "none"])
        .args(["--format", "{p}", "--locked"])
        .current_dir(repo_checks::root())
        .output()
        .expect("run cargo tree");
    assert!(
        out.status.success(),
        "cargo tree -p {package}: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    let mut names: Vec<String> = String::from_utf8_lossy(&out.stdout)
        .lines()
        .filter_map(|l| l.split_whitespace().next())
        .map(str::to_string)
        .collect();
    names.sort();
    names.dedup();
    names
}

#[test]
fn the_shipped_binary_links_no_simulator() {
    let tree = normal_tree("nri-accel");
    assert!(tree.iter().any(|p| p == "tokio"), "{tree:?}");
    for sim in ["nri-sim", "kube-sim", "nri-accel-demo"] {
        assert!(
            !tree.iter().any(|p| p == sim),
            "nri-accel's normal dependencies include {sim}: the simulators are test tools (a \
             dev-dependency of the plugin, a dependency of tests/demo), never part of the binary \
             the .deb ships"
        );
    }
}

#[test]
fn nri_proto_cdi_and_policies_depend_on_none_of_each_other() {
    let parts = ["nri-proto", "nri-accel-cdi", "nri-accel-policies"];
    for part in parts {
        let tree = normal_tree(part);
        for other in parts.iter().filter(|o| **o != part) {
            assert!(
                !tree.iter().any(|p| p == other),
                "{part} depends on {other}: the plugin is the one crate that wires them together"
            );
        }
    }
}
