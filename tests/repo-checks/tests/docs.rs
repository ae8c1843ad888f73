//! The README's first screens stay a true map: its tour names every top-level folder and its docs
//! list every guide in docs/, and no relative link in README.md or docs/ points at a file or a
//! heading that is not there.

use std::collections::BTreeSet;
use std::path::Path;
use std::process::Command;

use repo_checks::markdown::{anchors, code_spans, links, table_under};
use repo_checks::{read, root};

/// The folders at the top of the checkout that git tracks (what a fresh clone has), or, without
/// git, those on disk that the root .gitignore does not name.
fn top_level_folders() -> BTreeSet<String> {
    let root = root();
    let tracked = Command::new("git")
        .args(["ls-files", "-z"])
        .current_dir(&root)
        .output()
        .ok()
        .filter(|o| o.status.success() && !o.stdout.is_empty());
    if let Some(out) = tracked {
        return String::from_utf8_lossy(&out.stdout)
            .split('\0')
            .filter_map(|p| p.split_once('/').map(|(dir, _)| dir.to_string()))
            .collect();
    }
    let ignored: BTreeSet<String> = read(&root.join(".gitignore"))
        .lines()
        .filter_map(|l| l.strip_prefix('/'))
        .filter(|l| !l.contains('/'))
        .map(str::to_string)
        .collect();
    std::fs::read_dir(&root)
        .expect("read the root")
        .filter_map(Result::ok)
        .filter(|e| e.path().is_dir())
        .map(|e| e.file_name().to_string_lossy().into_owned())
        .filter(|n| n != ".git" && !ignored.contains(n))
        .collect()
}

fn guides() -> Vec<String> {
    let mut out: Vec<String> = std::fs::read_dir(root().join("docs"))
        .expect("read docs/")
        .filter_map(Result::ok)
        .map(|e| e.file_name().to_string_lossy().into_owned())
        .filter(|n| n.ends_with(".md"))
        .collect();
    out.sort();
    out
}

#[test]
fn the_tour_names_every_top_level_folder() {
    let readme = read(&root().join("README.md"));
    let rows = table_under(&readme, "A short tour");
    assert!(
        !rows.is_empty(),
        "README.md has no table under \"A short tour\""
    );
    let named: BTreeSet<String> = rows
        .iter()
        .flat_map(|r| code_spans(&r[0]))
        .map(|n| {
            n.trim_end_matches('/')
                .split('/')
                .next()
                .unwrap_or("")
                .to_string()
        })
        .collect();
    let folders = top_level_folders();
    assert!(folders.contains("plugin"), "{folders:?}");
    let missing: Vec<&String> = folders.iter().filter(|f| !named.contains(*f)).collect();
    assert!(
        missing.is_empty(),
        "README.md's tour (\"A short tour\") does not name {missing:?}: add a row saying what \
         each holds"
    );
    let gone: Vec<&String> = named.iter().filter(|n| !folders.contains(*n)).collect();
    assert!(
        gone.is_empty(),
        "README.md's tour names {gone:?}, which the checkout does not have"
    );
}

#[test]
fn the_readme_lists_every_guide() {
    let readme = read(&root().join("README.md"));
    let linked: BTreeSet<String> = links(&readme).into_iter().map(|l| l.target).collect();
    let missing: Vec<String> = guides()
        .into_iter()
        .filter(|g| !linked.contains(&format!("docs/{g}")))
        .collect();
    assert!(
        missing.is_empty(),
        "README.md does not link these guides: {missing:?} (add them to the Docs line under the \
         tour)"
    );
}

#[test]
fn relative_links_in_the_readme_and_docs_resolve() {
    let root = root();
    let mut pages = vec![root.join("README.md")];
    pages.extend(guides().iter().map(|g| root.join("docs").join(g)));
    let mut broken = Vec::new();
    let mut checked = 0;
    for page in &pages {
        let text = read(page);
        let dir = page.parent().unwrap_or(Path::new("."));
        for link in links(&text).into_iter().filter(|l| l.is_relative()) {
            checked += 1;
            let (file, anchor) = link.split();
            let target = if file.is_empty() {
                page.clone()
            } else {
                dir.join(file)
            };
            let at = format!(
                "{}:{}: {}",
                page.strip_prefix(&root).unwrap_or(page).display(),
                link.line,
                link.target
            );
            if !target.exists() {
                broken.push(format!("{at} (no such file)"));
                continue;
            }
            if let Some(anchor) = anchor.filter(|a| !a.is_empty())
                && target.extension().is_some_and(|e| e == "md")
                && !anchors(&read(&target)).contains(anchor)
            {
                broken.push(format!("{at} (no such heading)"));
            }
        }
    }
    assert!(checked > 30, "only {checked} relative links found");
    assert!(
        broken.is_empty(),
        "broken relative links:\n{}",
        broken.join("\n")
    );
}
