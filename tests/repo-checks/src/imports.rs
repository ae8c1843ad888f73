//! The file-level import graph of one crate, read from its sources: which file names an item of
//! which module through a `crate::`, `super::` or `self::` path (in a `use` or inline).
//!
//! Edges from a module's file to the files of its own submodules are left out: that is how a
//! module is put together from files (a `mod.rs` declaring, re-exporting and calling its parts),
//! not one part of the code depending on another. Everything else counts, so a cycle here is two
//! parts that each need the other, which is what the layering test refuses.
//!
//! The reader is a small lexer, not a Rust parser: comments, strings and character literals are
//! blanked, then paths are read from the tokens, with `use` groups (`crate::a::{b, c::d}`)
//! expanded and inline modules (`mod tests { use super::*; }`) tracked so `super` resolves
//! from where it is written. Macros that build paths are not expanded.

use std::collections::{BTreeMap, BTreeSet, VecDeque};
use std::path::{Path, PathBuf};

/// A module path from the crate root: `["engine", "ask"]` for `crate::engine::ask`.
pub type ModPath = Vec<String>;

/// One file of the crate and the module it holds.
#[derive(Debug, Clone)]
pub struct ModFile {
    /// The module it holds.
    pub module: ModPath,
    /// Its path, as given to [`Graph::build`] (joined from the crate root's directory).
    pub path: PathBuf,
}

/// One file naming an item of a module in another file.
#[derive(Debug, Clone, PartialEq, Eq, PartialOrd, Ord)]
pub struct Import {
    /// Index of the importing file in [`Graph::files`].
    pub from: usize,
    /// Index of the file holding the deepest module the path names.
    pub to: usize,
    /// The path as written, resolved from the crate root (`engine::ask::Ask`).
    pub path: ModPath,
}

/// The files of one crate and the imports between them.
#[derive(Debug, Default)]
pub struct Graph {
    /// Every file reached from the crate root through `mod x;` declarations.
    pub files: Vec<ModFile>,
    /// Every import from one file to another, composition edges included.
    pub imports: Vec<Import>,
}

impl Graph {
    /// Reads the crate whose root file is `root` from disk.
    pub fn load(root: &Path) -> Graph {
        Graph::build(root, &|p: &Path| std::fs::read_to_string(p).ok())
    }

    /// Builds the graph of the crate rooted at `root`, reading files through `read` (`None`: no
    /// such file).
    pub fn build(root: &Path, read: &dyn Fn(&Path) -> Option<String>) -> Graph {
        let mut g = Graph::default();
        let mut by_module: BTreeMap<ModPath, usize> = BTreeMap::new();
        let mut parsed = Vec::new();
        let dir = root.parent().unwrap_or(Path::new("")).to_path_buf();
        let mut queue = VecDeque::from([(Vec::new(), root.to_path_buf(), dir)]);
        while let Some((module, path, child_dir)) = queue.pop_front() {
            let Some(text) = read(&path) else {
                panic!("{} is declared but cannot be read", path.display());
            };
            let scan = scan(&text, &module);
            let pathed = path_attributes(&text);
            for child in &scan.children {
                let flat = child_dir.join(format!("{child}.rs"));
                let nested = child_dir.join(child).join("mod.rs");
                let mut m = module.clone();
                m.push(child.clone());
                let (file, dir) = if let Some(given) = pathed.get(child) {
                    // `#[path = "x.rs"]`: relative to the declaring file's directory.
                    let here = path.parent().unwrap_or(Path::new(""));
                    (here.join(given), here.join(child))
                } else if read(&flat).is_some() {
                    (flat, child_dir.join(child))
                } else if read(&nested).is_some() {
                    (nested, child_dir.join(child))
                } else {
                    panic!(
                        "{} declares mod {child}, found neither {} nor {}",
                        path.display(),
                        flat.display(),
                        nested.display()
                    );
                };
                queue.push_back((m, file, dir));
            }
            by_module.insert(module.clone(), g.files.len());
            g.files.push(ModFile { module, path });
            parsed.push(scan.paths);
        }
        for (from, paths) in parsed.into_iter().enumerate() {
            for path in paths {
                let to = (0..=path.len())
                    .rev()
                    .find_map(|n| by_module.get(&path[..n]).copied());
                if let Some(to) = to.filter(|&to| to != from) {
                    g.imports.push(Import { from, to, path });
                }
            }
        }
        g.imports.sort();
        g.imports
            .dedup_by(|a, b| a.from == b.from && a.to == b.to && a.path == b.path);
        g
    }

    /// Whether the import is how a module is assembled from its own files: from a module's file
    /// to a file of one of its submodules.
    pub fn is_composition(&self, import: &Import) -> bool {
        let (from, to) = (
            &self.files[import.from].module,
            &self.files[import.to].module,
        );
        to.len() > from.len() && to.starts_with(from)
    }

    /// The cycles among files, composition left out: for each group of files that reach one
    /// another, one cycle through it, as the files' paths (the first repeated at the end).
    pub fn cycles(&self) -> Vec<Vec<PathBuf>> {
        let mut next: Vec<BTreeSet<usize>> = vec![BTreeSet::new(); self.files.len()];
        for i in self.imports.iter().filter(|i| !self.is_composition(i)) {
            next[i.from].insert(i.to);
        }
        strongly_connected(&next)
            .into_iter()
            .filter(|group| group.len() > 1)
            .map(|group| {
                let start = group[0];
                shortest_cycle(&next, start, &group)
                    .into_iter()
                    .map(|f| self.files[f].path.clone())
                    .collect()
            })
            .collect()
    }
}

/// The files `#[path = "..."]` gives to the `mod x;` declarations after it, by module name.
fn path_attributes(text: &str) -> BTreeMap<String, String> {
    let mut out = BTreeMap::new();
    let mut pending: Option<String> = None;
    for line in text.lines().map(str::trim) {
        if let Some(rest) = line.strip_prefix("#[path") {
            pending = rest.split('"').nth(1).map(str::to_string);
            continue;
        }
        if line.starts_with("#[") || line.starts_with("//") {
            continue;
        }
        if let Some(given) = pending.take() {
            let decl = line
                .trim_start_matches("pub ")
                .trim_start_matches("pub(crate) ");
            if let Some(name) = decl.strip_prefix("mod ").and_then(|r| r.strip_suffix(';')) {
                out.insert(name.trim().to_string(), given);
            }
        }
    }
    out
}

/// What one file declares and names.
struct Scan {
    /// Submodules declared with `mod x;` (in files of their own).
    children: Vec<String>,
    /// Paths named through `crate`, `super` or `self`, resolved from the crate root.
    paths: Vec<ModPath>,
}

#[derive(Debug, Clone, PartialEq)]
enum Tok {
    Ident(String),
    PathSep,
    Open,
    Close,
    Semi,
    Comma,
    Star,
    Other,
}

fn scan(text: &str, module: &[String]) -> Scan {
    let toks = tokens(&blank(text));
    let mut out = Scan {
        children: Vec::new(),
        paths: Vec::new(),
    };
    // Inline modules open here: their name and the brace depth outside them.
    let mut inline: Vec<(String, usize)> = Vec::new();
    let mut depth = 0usize;
    let mut i = 0;
    while i < toks.len() {
        match &toks[i] {
            Tok::Ident(kw) if kw == "mod" => {
                if let (Some(Tok::Ident(name)), Some(after)) = (toks.get(i + 1), toks.get(i + 2)) {
                    match after {
                        Tok::Semi if inline.is_empty() => out.children.push(name.clone()),
                        Tok::Open => {
                            inline.push((name.clone(), depth));
                            depth += 1;
                            i += 3;
                            continue;
                        }
                        _ => {}
                    }
                }
                i += 1;
            }
            Tok::Open => {
                depth += 1;
                i += 1;
            }
            Tok::Close => {
                depth = depth.saturating_sub(1);
                if inline.last().is_some_and(|(_, d)| *d == depth) {
                    inline.pop();
                }
                i += 1;
            }
            Tok::Ident(start)
                if matches!(start.as_str(), "crate" | "super" | "self")
                    && toks.get(i + 1) == Some(&Tok::PathSep)
                    && (i == 0 || toks[i - 1] != Tok::PathSep) =>
            {
                let (paths, end) = path_tree(&toks, i);
                let mut here: ModPath = module.to_vec();
                here.extend(inline.iter().map(|(n, _)| n.clone()));
                for p in paths {
                    if let Some(resolved) = resolve(&here, &p) {
                        out.paths.push(resolved);
                    }
                }
                i = end.max(i + 1);
            }
            _ => i += 1,
        }
    }
    out
}

/// Resolves `crate::`, `super::` and `self::` from module `here`; `self` inside a path (from
/// `a::{self, b}`) names the module before it and is dropped.
fn resolve(here: &[String], path: &[String]) -> Option<ModPath> {
    let mut segs = path.iter().peekable();
    let mut base: ModPath = match segs.peek().map(|s| s.as_str()) {
        Some("crate") => {
            segs.next();
            Vec::new()
        }
        Some("super" | "self") => here.to_vec(),
        _ => return None,
    };
    while let Some(s) = segs.peek() {
        match s.as_str() {
            "super" => {
                base.pop()?;
            }
            "self" => {}
            _ => break,
        }
        segs.next();
    }
    base.extend(segs.filter(|s| *s != "self").cloned());
    Some(base)
}

/// Reads the path starting at token `i` (an identifier), expanding `{...}` groups: every path it
/// names, and the index of the first token after it.
fn path_tree(toks: &[Tok], i: usize) -> (Vec<ModPath>, usize) {
    let mut segs = Vec::new();
    let mut i = i;
    match toks.get(i) {
        Some(Tok::Ident(s)) => {
            segs.push(s.clone());
            i += 1;
        }
        Some(Tok::Star) => return (vec![segs], i + 1),
        Some(Tok::Open) => return group(toks, i, &segs),
        _ => return (vec![], i + 1),
    }
    while toks.get(i) == Some(&Tok::PathSep) {
        match toks.get(i + 1) {
            Some(Tok::Ident(s)) => {
                segs.push(s.clone());
                i += 2;
            }
            Some(Tok::Star) => return (vec![segs], i + 2),
            Some(Tok::Open) => return group(toks, i + 1, &segs),
            // `::<T>` and the like: the path ends here.
            _ => return (vec![segs], i + 1),
        }
    }
    (vec![segs], i)
}

/// Reads the group opening at token `i` (`{`) after `prefix`.
fn group(toks: &[Tok], i: usize, prefix: &[String]) -> (Vec<ModPath>, usize) {
    let mut out = Vec::new();
    let mut i = i + 1;
    while i < toks.len() {
        match &toks[i] {
            Tok::Close => return (out, i + 1),
            Tok::Comma => i += 1,
            Tok::Ident(_) | Tok::Star | Tok::Open => {
                let (subs, end) = path_tree(toks, i);
                for sub in subs {
                    let mut p = prefix.to_vec();
                    p.extend(sub);
                    out.push(p);
                }
                // Skip what follows a member up to the next one (`as alias`).
                i = end;
                while i < toks.len() && !matches!(toks[i], Tok::Comma | Tok::Close) {
                    i += 1;
                }
            }
            _ => i += 1,
        }
    }
    (out, i)
}

fn tokens(text: &str) -> Vec<Tok> {
    let chars: Vec<char> = text.chars().collect();
    let mut out = Vec::new();
    let mut i = 0;
    while i < chars.len() {
        let c = chars[i];
        if c.is_alphanumeric() || c == '_' {
            let start = i;
            while i < chars.len() && (chars[i].is_alphanumeric() || chars[i] == '_') {
                i += 1;
            }
            let word: String = chars[start..i].iter().collect();
            // Raw identifiers (`r#type`) name the same thing as without the prefix.
            out.push(Tok::Ident(word));
            continue;
        }
        out.push(match c {
            ':' if chars.get(i + 1) == Some(&':') => {
                i += 1;
                Tok::PathSep
            }
            '{' => Tok::Open,
            '}' => Tok::Close,
            ';' => Tok::Semi,
            ',' => Tok::Comma,
            '*' => Tok::Star,
            c if c.is_whitespace() => {
                i += 1;
                continue;
            }
            _ => Tok::Other,
        });
        i += 1;
    }
    out
}

/// The text with comments, string literals and character literals replaced by spaces, so
/// their braces and words are not read as code. Lifetimes (`'a`) stay.
fn blank(text: &str) -> String {
    let c: Vec<char> = text.chars().collect();
    let mut out = String::with_capacity(text.len());
    let mut i = 0;
    while i < c.len() {
        let at = |k: usize| c.get(i + k).copied();
        // Line comment.
        if c[i] == '/' && at(1) == Some('/') {
            while i < c.len() && c[i] != '\n' {
                i += 1;
            }
            continue;
        }
        // Block comment, nested.
        if c[i] == '/' && at(1) == Some('*') {
            let mut depth = 0;
            while i < c.len() {
                if c[i] == '/' && c.get(i + 1) == Some(&'*') {
                    depth += 1;
                    i += 2;
                } else if c[i] == '*' && c.get(i + 1) == Some(&'/') {
                    depth -= 1;
                    i += 2;
                    if depth == 0 {
                        break;
                    }
                } else {
                    i += 1;
                }
            }
            out.push(' ');
            continue;
        }
        // Raw strings: r"..", r#".."#, br#".."#.
        let prev_word = i > 0 && (c[i - 1].is_alphanumeric() || c[i - 1] == '_');
        if !prev_word && (c[i] == 'r' || (c[i] == 'b' && at(1) == Some('r'))) {
            let mut j = i + if c[i] == 'b' { 2 } else { 1 };
            let mut hashes = 0;
            while c.get(j) == Some(&'#') {
                hashes += 1;
                j += 1;
            }
            if c.get(j) == Some(&'"') {
                j += 1;
                loop {
                    if j >= c.len() {
                        break;
                    }
                    if c[j] == '"' && (0..hashes).all(|h| c.get(j + 1 + h) == Some(&'#')) {
                        j += 1 + hashes;
                        break;
                    }
                    j += 1;
                }
                out.push(' ');
                i = j;
                continue;
            }
        }
        // Strings (and byte strings: the `b` before stays a harmless word).
        if c[i] == '"' {
            i += 1;
            while i < c.len() && c[i] != '"' {
                if c[i] == '\\' {
                    i += 1;
                }
                i += 1;
            }
            i += 1;
            out.push(' ');
            continue;
        }
        // Character literals, not lifetimes: '\..' or 'x'.
        if c[i] == '\'' {
            if at(1) == Some('\\') {
                let mut j = i + 2;
                while j < c.len() && c[j] != '\'' {
                    j += 1;
                }
                i = j + 1;
                out.push(' ');
                continue;
            }
            if at(2) == Some('\'') {
                i += 3;
                out.push(' ');
                continue;
            }
        }
        out.push(c[i]);
        i += 1;
    }
    out
}

/// Tarjan's strongly connected components of the graph `next` (node -> successors).
fn strongly_connected(next: &[BTreeSet<usize>]) -> Vec<Vec<usize>> {
    struct State<'a> {
        next: &'a [BTreeSet<usize>],
        index: Vec<Option<usize>>,
        low: Vec<usize>,
        stack: Vec<usize>,
        on_stack: Vec<bool>,
        counter: usize,
        out: Vec<Vec<usize>>,
    }
    fn visit(s: &mut State<'_>, v: usize) {
        s.index[v] = Some(s.counter);
        s.low[v] = s.counter;
        s.counter += 1;
        s.stack.push(v);
        s.on_stack[v] = true;
        for &w in s.next[v].iter() {
            match s.index[w] {
                None => {
                    visit(s, w);
                    s.low[v] = s.low[v].min(s.low[w]);
                }
                Some(iw) if s.on_stack[w] => s.low[v] = s.low[v].min(iw),
                Some(_) => {}
            }
        }
        if Some(s.low[v]) == s.index[v] {
            let mut group = Vec::new();
            while let Some(w) = s.stack.pop() {
                s.on_stack[w] = false;
                group.push(w);
                if w == v {
                    break;
                }
            }
            group.sort();
            s.out.push(group);
        }
    }
    let n = next.len();
    let mut s = State {
        next,
        index: vec![None; n],
        low: vec![0; n],
        stack: Vec::new(),
        on_stack: vec![false; n],
        counter: 0,
        out: Vec::new(),
    };
    for v in 0..n {
        if s.index[v].is_none() {
            visit(&mut s, v);
        }
    }
    s.out
}

/// The shortest path from `start` back to itself inside `group` (breadth first).
fn shortest_cycle(next: &[BTreeSet<usize>], start: usize, group: &[usize]) -> Vec<usize> {
    let mut came_from: BTreeMap<usize, usize> = BTreeMap::new();
    let mut queue = VecDeque::from([start]);
    while let Some(v) = queue.pop_front() {
        for &w in next[v].iter().filter(|w| group.contains(w)) {
            if w == start {
                let mut back = vec![v];
                let mut at = v;
                while at != start {
                    at = came_from[&at];
                    back.push(at);
                }
                back.reverse();
                back.push(start);
                return back;
            }
            if let std::collections::btree_map::Entry::Vacant(e) = came_from.entry(w) {
                e.insert(v);
                queue.push_back(w);
            }
        }
    }
    vec![start, start]
}

#[cfg(test)]
mod tests {
    use std::collections::HashMap;

    use super::*;

    fn graph(files: &[(&str, &str)]) -> Graph {
        let map: HashMap<PathBuf, String> = files
            .iter()
            .map(|(p, t)| (PathBuf::from(p), t.to_string()))
            .collect();
        Graph::build(Path::new("src/lib.rs"), &|p: &Path| map.get(p).cloned())
    }

    fn names(g: &Graph) -> Vec<(String, String)> {
        g.imports
            .iter()
            .map(|i| {
                (
                    g.files[i.from].path.display().to_string(),
                    g.files[i.to].path.display().to_string(),
                )
            })
            .collect()
    }

    #[test]
    fn reads_use_groups_inline_paths_and_nested_modules() {
        let g = graph(&[
            ("src/lib.rs", "pub mod a;\nmod b;\n"),
            (
                "src/a/mod.rs",
                "mod inner;\nuse crate::{b::{self, Thing as T}, a::inner::X};\n",
            ),
            ("src/a/inner.rs", "fn f() { super::super::b::g(); }"),
            (
                "src/b.rs",
                "pub fn g() {}\n#[cfg(test)]\nmod tests { use super::*; }",
            ),
        ]);
        let found = names(&g);
        assert!(
            found.contains(&("src/a/mod.rs".into(), "src/b.rs".into())),
            "{found:?}"
        );
        assert!(
            found.contains(&("src/a/mod.rs".into(), "src/a/inner.rs".into())),
            "{found:?}"
        );
        assert!(
            found.contains(&("src/a/inner.rs".into(), "src/b.rs".into())),
            "{found:?}"
        );
        // `super` inside b.rs's inline tests module is b itself: no import.
        assert!(!found.iter().any(|(f, _)| f == "src/b.rs"), "{found:?}");
    }

    #[test]
    fn a_path_attribute_names_the_file() {
        let g = graph(&[
            ("src/lib.rs", "mod a;\n"),
            (
                "src/a.rs",
                "#[cfg(test)]\n#[path = \"a_tests.rs\"]\nmod tests;\n",
            ),
            ("src/a_tests.rs", "use super::super::a;\n"),
        ]);
        let files: Vec<String> = g
            .files
            .iter()
            .map(|f| f.path.display().to_string())
            .collect();
        assert!(files.contains(&"src/a_tests.rs".to_string()), "{files:?}");
    }

    #[test]
    fn comments_strings_and_char_literals_are_not_code() {
        let g = graph(&[
            ("src/lib.rs", "mod a;\nmod b;\n"),
            (
                "src/a.rs",
                "// crate::b::x\n/* crate::b::y /* nested */ */\nconst S: &str = \"crate::b::z {\";\nconst R: &str = r#\"crate::b \"q\" \"#;\nconst C: char = '{';\nfn f<'a>(x: &'a str) {}\n",
            ),
            ("src/b.rs", ""),
        ]);
        assert!(g.imports.is_empty(), "{:?}", names(&g));
    }

    #[test]
    fn a_module_assembled_from_files_is_no_cycle_but_siblings_are() {
        let g = graph(&[
            ("src/lib.rs", "mod m;\n"),
            (
                "src/m/mod.rs",
                "mod a;\nmod b;\npub struct S;\nfn f() { a::f(); }",
            ),
            (
                "src/m/a.rs",
                "use super::S;\nuse super::b::B;\npub fn f() {}",
            ),
            ("src/m/b.rs", "pub struct B;\n"),
        ]);
        assert!(g.cycles().is_empty(), "{:?}", g.cycles());
        let g = graph(&[
            ("src/lib.rs", "mod m;\n"),
            ("src/m/mod.rs", "mod a;\nmod b;\n"),
            ("src/m/a.rs", "use super::b::B;\npub struct A;"),
            ("src/m/b.rs", "pub struct B(super::a::A);\n"),
        ]);
        let cycles = g.cycles();
        assert_eq!(cycles.len(), 1, "{cycles:?}");
        assert_eq!(cycles[0].first(), cycles[0].last());
        assert_eq!(cycles[0].len(), 3, "{cycles:?}");
    }

    #[test]
    fn a_longer_cycle_is_reported_in_order() {
        let g = graph(&[
            ("src/lib.rs", "mod a;\nmod b;\nmod c;\n"),
            ("src/a.rs", "use crate::b::B;"),
            ("src/b.rs", "use crate::c::C;"),
            ("src/c.rs", "use crate::a::A;"),
        ]);
        let cycles = g.cycles();
        let shown: Vec<String> = cycles[0].iter().map(|p| p.display().to_string()).collect();
        assert_eq!(
            shown,
            ["src/a.rs", "src/b.rs", "src/c.rs", "src/a.rs"],
            "{shown:?}"
        );
    }
}
