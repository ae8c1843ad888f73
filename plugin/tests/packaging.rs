//! What the .deb packages install, checked from their metadata without building them (the
//! packaging CI step, `packaging/ci-check.sh`, builds the stock one and checks its contents):
//! every doc an installed file points to is installed too, and the short description is one line.

use std::collections::BTreeSet;
use std::path::{Path, PathBuf};

use serde_json::Value;

/// Where the docs land on a node.
const DOC_DIR: &str = "usr/share/doc/nri-accel/";

/// The packages of the workspace that carry `[package.metadata.deb]`, with their manifest dirs.
fn deb_packages() -> Vec<(String, PathBuf, Value)> {
    let cargo = std::env::var("CARGO").unwrap_or_else(|_| "cargo".into());
    let out = std::process::Command::new(cargo)
        .args(["metadata", "--no-deps", "--format-version", "1"])
        .current_dir(env!("CARGO_MANIFEST_DIR"))
        .output()
        .expect("cargo metadata");
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let doc: Value = serde_json::from_slice(&out.stdout).expect("metadata JSON");
    doc["packages"]
        .as_array()
        .expect("packages")
        .iter()
        .filter(|p| p["metadata"]["deb"].is_object())
        .map(|p| {
            let manifest = PathBuf::from(p["manifest_path"].as_str().expect("manifest"));
            (
                p["name"].as_str().unwrap_or_default().to_string(),
                manifest.parent().expect("dir").to_path_buf(),
                p.clone(),
            )
        })
        .collect()
}

/// `name.md` words and `/usr/share/doc/nri-accel/...` paths in `text`.
fn references(text: &str) -> (BTreeSet<String>, BTreeSet<String>) {
    let mut docs = BTreeSet::new();
    let mut paths = BTreeSet::new();
    let is_word = |c: char| c.is_ascii_alphanumeric() || c == '-' || c == '_';
    for (i, _) in text.match_indices(".md") {
        if text[i + 3..].starts_with(|c: char| c.is_ascii_alphanumeric()) {
            continue;
        }
        let start = text[..i].rfind(|c: char| !is_word(c)).map_or(0, |s| s + 1);
        // `docs/x.md` and a bare `x.md` name a doc; another path (`packaging/README.md`) names a
        // source file, not something installed under that name.
        let in_other_dir = text[..start].ends_with('/') && !text[..start].ends_with("docs/");
        if start < i && !in_other_dir {
            docs.insert(format!("{}.md", &text[start..i]));
        }
    }
    let absolute = format!("/{DOC_DIR}");
    for (i, _) in text.match_indices(&absolute) {
        let rest = &text[i + 1..];
        let end = rest
            .find(|c: char| c.is_whitespace() || "`)'\"".contains(c))
            .unwrap_or(rest.len());
        paths.insert(
            rest[..end]
                .trim_end_matches(['.', ',', ';', ':'])
                .to_string(),
        );
    }
    (docs, paths)
}

/// An asset's files and where each lands: a `dir/*.ext` source is every such file of `dir`, and
/// a destination ending in `/` is a directory (cargo-deb's rules for the two forms used here).
fn expand(source: &Path, dest: &str) -> Vec<(PathBuf, String)> {
    let name = source
        .file_name()
        .and_then(|n| n.to_str())
        .unwrap_or_default();
    let files: Vec<PathBuf> = match name.strip_prefix('*') {
        Some(suffix) => {
            let dir = source.parent().expect("a directory");
            let mut found: Vec<PathBuf> = std::fs::read_dir(dir)
                .unwrap_or_else(|e| panic!("{}: {e}", dir.display()))
                .filter_map(|e| e.ok().map(|e| e.path()))
                .filter(|p| p.to_str().is_some_and(|p| p.ends_with(suffix)))
                .collect();
            found.sort();
            found
        }
        None => vec![source.to_path_buf()],
    };
    files
        .into_iter()
        .map(|f| {
            let to = if dest.ends_with('/') {
                format!(
                    "{dest}{}",
                    f.file_name().and_then(|n| n.to_str()).unwrap_or_default()
                )
            } else {
                dest.to_string()
            };
            (f, to)
        })
        .collect()
}

/// What a package installs: (source file, destination without the leading `/`), the unit
/// included.
fn installed(dir: &Path, package: &Value) -> Vec<(PathBuf, String)> {
    let deb = &package["metadata"]["deb"];
    let mut installed: Vec<(PathBuf, String)> = deb["assets"]
        .as_array()
        .expect("assets")
        .iter()
        .flat_map(|a| {
            expand(
                &dir.join(a[0].as_str().expect("source")),
                a[1].as_str().expect("destination"),
            )
        })
        .collect();
    let unit_dir = deb["systemd-units"]["unit-scripts"]
        .as_str()
        .expect("unit dir");
    let unit = deb["systemd-units"]["unit-name"]
        .as_str()
        .expect("unit name");
    installed.push((
        dir.join(unit_dir).join(format!("{unit}.service")),
        format!("usr/lib/systemd/system/{unit}.service"),
    ));
    installed
}

/// The stock package's files, sources made canonical.
fn stock_package() -> Vec<(PathBuf, String)> {
    let (_, dir, package) = deb_packages()
        .into_iter()
        .find(|(n, _, _)| n == "nri-accel")
        .expect("the nri-accel package");
    installed(&dir, &package)
        .into_iter()
        // The binary's source is a build output that may not exist yet.
        .map(|(source, dest)| (source.canonicalize().unwrap_or(source), dest))
        .collect()
}

/// The workspace root.
fn repo() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("..")
        .canonicalize()
        .expect("workspace root")
}

/// The `code` spans of a line of markdown.
fn code_spans(line: &str) -> Vec<&str> {
    line.split('`').skip(1).step_by(2).collect()
}

#[test]
fn every_doc_an_installed_file_points_to_is_installed() {
    let packages = deb_packages();
    assert!(packages.iter().any(|(n, _, _)| n == "nri-accel"));
    for (name, dir, package) in &packages {
        let installed = installed(dir, package);
        let dests: BTreeSet<&str> = installed.iter().map(|(_, d)| d.as_str()).collect();
        let mut missing = Vec::new();
        for (source, dest) in &installed {
            let text_file = [".md", ".yaml", ".conf", ".toml", ".service"]
                .iter()
                .any(|ext| dest.ends_with(ext));
            if !text_file {
                continue;
            }
            let text = std::fs::read_to_string(source)
                .unwrap_or_else(|e| panic!("{name}: {}: {e}", source.display()));
            let (docs, paths) = references(&text);
            for doc in docs {
                if !dests.contains(format!("{DOC_DIR}{doc}").as_str()) {
                    missing.push(format!(
                        "{dest} mentions {doc}, which {name} does not install"
                    ));
                }
            }
            for path in paths {
                let dir_ref = path.ends_with('/');
                let found = dests.iter().any(|d| {
                    if dir_ref {
                        d.starts_with(&path)
                    } else {
                        *d == path
                    }
                });
                if !found {
                    missing.push(format!(
                        "{dest} points to /{path}, which {name} does not install"
                    ));
                }
            }
        }
        assert!(missing.is_empty(), "{}", missing.join("\n"));
    }
}

#[test]
fn the_stock_package_ships_the_daemon_binary_alone() {
    let (_, _, package) = deb_packages()
        .into_iter()
        .find(|(n, _, _)| n == "nri-accel")
        .expect("the nri-accel package");
    let built: Vec<&str> = package["metadata"]["deb"]["assets"]
        .as_array()
        .expect("assets")
        .iter()
        .filter_map(|a| a[0].as_str())
        .filter(|s| s.starts_with("target/"))
        .collect();
    // cargo-deb reads `target/release/` as "the profile being packaged" (dist for a real .deb).
    assert_eq!(
        built,
        ["target/release/nri-accel"],
        "the .deb ships nri-accel alone: never the demo build (tests/demo) or a simulator"
    );
}

#[test]
fn the_stock_package_ships_the_dashboard_and_the_alert_rules() {
    let shipped = stock_package();
    for (source, dest) in [
        (
            "packaging/grafana/nri-accel.json",
            "usr/share/doc/nri-accel/examples/grafana/nri-accel.json",
        ),
        (
            "packaging/prometheus/nri-accel-rules.yaml",
            "usr/share/doc/nri-accel/examples/prometheus/nri-accel-rules.yaml",
        ),
    ] {
        let source = repo().join(source);
        assert!(
            shipped.iter().any(|(s, d)| *s == source && d == dest),
            "the .deb does not install {} at /{dest}",
            source.display()
        );
    }
}

#[test]
fn the_short_description_is_one_line_of_a_package_list() {
    for (name, _, package) in deb_packages() {
        let short = package["description"].as_str().unwrap_or_default();
        // cargo-deb cuts a longer description at 79 characters and the rest wraps into the long
        // description that `apt show` prints.
        assert!(
            !short.is_empty() && short.chars().count() <= 79 && !short.contains('\n'),
            "{name}: description {short:?} is not one line of at most 79 characters"
        );
        assert!(
            !short.to_ascii_lowercase().starts_with(&name),
            "{name}: the short description repeats the package name"
        );
    }
}

#[test]
fn references_are_found_in_prose_and_paths() {
    let (docs, paths) = references(
        "see docs/state.md, and [refusals](refusals.md); /usr/share/doc/nri-accel/examples/x.conf \
         and `/usr/share/doc/nri-accel/`; packaging/README.md is a source file.",
    );
    assert_eq!(
        docs,
        BTreeSet::from(["state.md".to_string(), "refusals.md".to_string()])
    );
    assert_eq!(
        paths,
        BTreeSet::from([
            "usr/share/doc/nri-accel/examples/x.conf".to_string(),
            "usr/share/doc/nri-accel/".to_string()
        ])
    );
    assert!(Path::new(DOC_DIR).is_relative());
}

/// packaging/README.md's table says where each file of packaging/ goes: the path it names is
/// where the package puts it (a path without `/` is under the doc dir), `not installed` is not
/// in the package, and no file of packaging/ is left out of the table.
#[test]
fn the_packaging_readme_says_where_each_file_goes() {
    let installed = stock_package();
    let packaging = repo().join("packaging");
    let text = std::fs::read_to_string(packaging.join("README.md")).expect("packaging/README.md");
    let mut covered: BTreeSet<PathBuf> = BTreeSet::new();
    let mut wrong = Vec::new();
    for line in text.lines().filter(|l| l.starts_with("| `")) {
        let cells: Vec<&str> = line.split(" | ").collect();
        let pattern = code_spans(cells[0])[0];
        let sources: Vec<PathBuf> = match pattern.split_once("/*") {
            Some((sub, ext)) => std::fs::read_dir(packaging.join(sub))
                .expect("a folder of packaging/")
                .map(|e| e.expect("entry").path())
                .filter(|p| p.to_string_lossy().ends_with(ext))
                .collect(),
            None => vec![packaging.join(pattern)],
        };
        assert!(!sources.is_empty(), "{pattern} names no file");
        for source in sources {
            let source = source
                .canonicalize()
                .unwrap_or_else(|e| panic!("{pattern}: {e}"));
            covered.insert(source.clone());
            let dests: Vec<&str> = installed
                .iter()
                .filter(|(s, _)| *s == source)
                .map(|(_, d)| d.as_str())
                .collect();
            if cells[1].contains("not installed") {
                if !dests.is_empty() {
                    wrong.push(format!(
                        "{pattern}: said not installed, installed as {dests:?}"
                    ));
                }
                continue;
            }
            let Some(said) = code_spans(cells[1]).first().copied() else {
                // Merged into a generated file (prerm): nothing of its own is installed.
                continue;
            };
            let expected = match said.strip_prefix('/') {
                Some(absolute) => absolute.to_string(),
                None => format!("{DOC_DIR}{said}"),
            };
            let found = dests
                .iter()
                .any(|d| *d == expected || (expected.ends_with('/') && d.starts_with(&expected)));
            if !found {
                wrong.push(format!("{pattern}: said {said}, installed as {dests:?}"));
            }
        }
    }
    for entry in walk(&packaging) {
        if !covered.contains(&entry) {
            wrong.push(format!("{} is not in the table", entry.display()));
        }
    }
    assert!(wrong.is_empty(), "{}", wrong.join("\n"));
}

/// Every file under `dir`, canonical.
fn walk(dir: &Path) -> Vec<PathBuf> {
    let mut out = Vec::new();
    for e in std::fs::read_dir(dir).expect("readable") {
        let path = e.expect("entry").path();
        if path.is_dir() {
            out.extend(walk(&path));
        } else {
            out.push(path.canonicalize().expect("canonical"));
        }
    }
    out
}

/// The operator guide's list of installed docs names every doc the package installs, and every
/// source path it names (`packaging/...`, `docs/...`, `examples/...`) exists in the tree: a path
/// that exists only in the package is written as its installed path.
#[test]
fn the_operator_guide_names_every_installed_doc_and_only_paths_the_tree_has() {
    let installed = stock_package();
    let text = std::fs::read_to_string(repo().join("docs/operator-guide.md")).expect("the guide");
    let row = text
        .lines()
        .find(|l| l.starts_with("| `/usr/share/doc/nri-accel/` |"))
        .expect("the guide's row for /usr/share/doc/nri-accel/");
    let mut missing = Vec::new();
    for (_, dest) in &installed {
        if let Some(doc) = dest.strip_prefix(DOC_DIR)
            && doc.ends_with(".md")
            && !doc.contains('/')
            && !row.contains(doc)
        {
            missing.push(format!("the guide's list of installed docs lacks {doc}"));
        }
    }
    for span in text.lines().flat_map(code_spans) {
        let path = span.trim_end_matches(['.', ',', ':', ')']);
        let source = ["packaging/", "docs/", "examples/", "plugin/", "tests/"]
            .iter()
            .any(|p| path.starts_with(p));
        if source && !path.contains(['<', '*', ' ']) && !repo().join(path).exists() {
            missing.push(format!(
                "the guide names {path}, which the source tree lacks"
            ));
        }
    }
    assert!(missing.is_empty(), "{}", missing.join("\n"));
}

/// The relative targets of the markdown links and images in `text` (`[x](img/a.png)`, not
/// `http...`, not `#anchor`), without their `#fragment`.
fn relative_links(text: &str) -> BTreeSet<String> {
    let mut out = BTreeSet::new();
    for (i, _) in text.match_indices("](") {
        let rest = &text[i + 2..];
        let Some(end) = rest.find(')') else { continue };
        let target = rest[..end].split('#').next().unwrap_or_default();
        if target.is_empty() || target.contains("://") || target.contains(' ') {
            continue;
        }
        out.insert(target.to_string());
    }
    out
}

/// A picture or file an installed doc links to (`![...](img/dashboard.png)`) is installed beside
/// it: the guide on a node must not show a broken image (issue 39 item 9).
#[test]
fn every_file_an_installed_doc_links_to_is_installed() {
    let shipped = stock_package();
    let dests: BTreeSet<&str> = shipped.iter().map(|(_, d)| d.as_str()).collect();
    let mut missing = Vec::new();
    for (source, dest) in &shipped {
        let Some(doc) = dest.strip_prefix(DOC_DIR) else {
            continue;
        };
        if !doc.ends_with(".md") || doc.contains('/') {
            continue;
        }
        let text = std::fs::read_to_string(source).expect("an installed doc");
        for target in relative_links(&text) {
            // A doc names a source file of the repository (`../packaging/...`) as a repo link;
            // those are checked by the repository's link check, not installed.
            if target.starts_with("../") || target.ends_with(".md") {
                continue;
            }
            if !dests.contains(format!("{DOC_DIR}{target}").as_str()) {
                missing.push(format!(
                    "{doc} links to {target}, which the .deb does not install at /{DOC_DIR}{target}"
                ));
            }
        }
    }
    assert!(missing.is_empty(), "{}", missing.join("\n"));
}

/// cargo-deb replaces the `#DEBHELPER#` marker wherever it appears in a maintainer script,
/// comments included: a second one ran the generated stop step twice and left a stray line
/// (issue 39 item 9). Each script names the marker once, on a line of its own.
#[test]
fn each_maintainer_script_names_the_debhelper_marker_once() {
    let marker = "#DEBHELPER#";
    for script in ["preinst", "postinst", "prerm", "postrm"] {
        let path = repo().join("packaging").join(script);
        let Ok(text) = std::fs::read_to_string(&path) else {
            continue;
        };
        let lines: Vec<&str> = text.lines().filter(|l| l.contains(marker)).collect();
        assert_eq!(
            lines,
            [marker],
            "{}: the marker must appear exactly once, alone on its line",
            path.display()
        );
    }
}
