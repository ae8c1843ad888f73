//! docs/policy-guide.md cannot drift from this crate: its `rust` blocks are compiled as this
//! crate's doc-tests (`src/lib.rs`, `PolicyGuide`); here, its excerpts (`rust,ignore` blocks) are
//! checked line by line against `src/lib.rs`, the daemon's `main` block against `src/main.rs`, and
//! the walk-through's `src/main.rs` against that block.

const GUIDE: &str = include_str!("../../../docs/policy-guide.md");
const LIB: &str = include_str!("../src/lib.rs");
const MAIN: &str = include_str!("../src/main.rs");

/// The fenced blocks of `text` whose info string is `info`, as their text.
fn blocks<'a>(text: &'a str, info: &str) -> Vec<&'a str> {
    let open = format!("```{info}\n");
    let mut out = Vec::new();
    let mut rest = text;
    while let Some(start) = rest.find(&open) {
        let body = &rest[start + open.len()..];
        let end = body.find("\n```").expect("a closed fence");
        out.push(&body[..end]);
        rest = &body[end..];
    }
    out
}

/// Non-blank lines, trimmed.
fn lines(text: &str) -> Vec<&str> {
    text.lines()
        .map(str::trim)
        .filter(|l| !l.is_empty())
        .collect()
}

#[test]
fn excerpts_are_lines_of_the_policy_source() {
    let source: Vec<&str> = lines(LIB);
    let excerpts = blocks(GUIDE, "rust,ignore");
    assert!(!excerpts.is_empty());
    for excerpt in excerpts {
        for line in lines(excerpt) {
            assert!(
                source.contains(&line),
                "the guide quotes a line src/lib.rs does not have: {line}"
            );
        }
    }
}

#[test]
fn the_daemon_main_of_the_guide_is_the_example_and_the_walk_through() {
    let guide_main = blocks(GUIDE, "rust,no_run");
    assert_eq!(guide_main.len(), 1, "one daemon main in the guide");
    let wanted = lines(guide_main[0]);
    let example: Vec<&str> = lines(MAIN)
        .into_iter()
        .filter(|l| !l.starts_with("//"))
        .collect();
    assert_eq!(example, wanted, "src/main.rs differs from the guide's main");
    // The walk-through writes the same main, with the policy as a module.
    let written = GUIDE
        .split("cat > src/main.rs <<'EOF'\n")
        .nth(1)
        .and_then(|rest| rest.split("\nEOF").next())
        .expect("the walk-through writes src/main.rs");
    let written: Vec<&str> = lines(written)
        .into_iter()
        .filter(|l| *l != "mod spread;")
        .collect();
    assert_eq!(
        written, wanted,
        "the walk-through's main differs from the guide's"
    );
}
