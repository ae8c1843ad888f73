//! What a Markdown page links to and which anchors its headings give, read the way GitHub renders
//! them, closely enough for checking a repository's own pages: fenced code blocks and inline
//! code are not text, a heading's anchor is its text lowercased with punctuation dropped and
//! spaces turned into hyphens, and a repeated heading gets `-1`, `-2`, ...

use std::collections::{BTreeMap, BTreeSet};

/// One link: where it points and the line it is on (1-based).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Link {
    /// The target as written (`docs/state.md#files`, `#status`, `https://...`).
    pub target: String,
    /// The line it is on.
    pub line: usize,
}

impl Link {
    /// Whether the target is inside the repository: no scheme (`https:`, `mailto:`) and not
    /// rooted at the site (`/`).
    pub fn is_relative(&self) -> bool {
        !self.target.contains("://")
            && !self.target.starts_with("mailto:")
            && !self.target.starts_with('/')
    }

    /// The file part and the anchor part (`("docs/x.md", Some("y"))` for `docs/x.md#y`; an empty
    /// file part is the page itself).
    pub fn split(&self) -> (&str, Option<&str>) {
        match self.target.split_once('#') {
            Some((file, anchor)) => (file, Some(anchor)),
            None => (self.target.as_str(), None),
        }
    }
}

/// The page's lines that are text: fenced code blocks blanked (so line numbers stay), inline
/// code spans removed.
fn text_lines(page: &str) -> Vec<String> {
    let mut fence: Option<String> = None;
    page.lines()
        .map(|line| {
            let trimmed = line.trim_start();
            if let Some(open) = &fence {
                if trimmed.starts_with(open.as_str()) {
                    fence = None;
                }
                return String::new();
            }
            for mark in ["```", "~~~"] {
                if trimmed.starts_with(mark) {
                    fence = Some(mark.to_string());
                    return String::new();
                }
            }
            without_code_spans(line)
        })
        .collect()
}

fn without_code_spans(line: &str) -> String {
    let pieces: Vec<&str> = line.split('`').collect();
    // Odd pieces are inside backticks; an unpaired backtick leaves the line as text.
    if pieces.len().is_multiple_of(2) {
        return line.to_string();
    }
    pieces
        .iter()
        .enumerate()
        .map(|(i, piece)| if i % 2 == 0 { *piece } else { " " })
        .collect()
}

/// Every inline link and image (`[text](target)`, `![alt](target)`) and every reference
/// definition (`[name]: target`) of the page.
pub fn links(page: &str) -> Vec<Link> {
    let mut out = Vec::new();
    for (n, line) in text_lines(page).iter().enumerate() {
        let line_no = n + 1;
        let trimmed = line.trim_start();
        if trimmed.starts_with('[')
            && let Some(end) = trimmed.find("]:")
        {
            let target = trimmed[end + 2..].split_whitespace().next().unwrap_or("");
            if !target.is_empty() {
                out.push(Link {
                    target: target.trim_matches(['<', '>']).to_string(),
                    line: line_no,
                });
            }
            continue;
        }
        let mut rest = line.as_str();
        while let Some(at) = rest.find("](") {
            let after = &rest[at + 2..];
            let Some(close) = after.find(')') else { break };
            // `[x](target "title")`: the target is the first word.
            let target = after[..close].split_whitespace().next().unwrap_or("");
            if !target.is_empty() {
                out.push(Link {
                    target: target.trim_matches(['<', '>']).to_string(),
                    line: line_no,
                });
            }
            rest = &after[close + 1..];
        }
    }
    out
}

/// The anchors the page's headings give (`## Big nodes` -> `big-nodes`), repeats numbered.
pub fn anchors(page: &str) -> BTreeSet<String> {
    let mut seen: BTreeMap<String, usize> = BTreeMap::new();
    let mut out = BTreeSet::new();
    let raw: Vec<&str> = page.lines().collect();
    for (n, line) in text_lines(page).iter().enumerate() {
        let trimmed = line.trim_start();
        let hashes = trimmed.chars().take_while(|&c| c == '#').count();
        if hashes == 0 || hashes > 6 || !trimmed[hashes..].starts_with(' ') {
            continue;
        }
        // The heading as written, inline code included (text_lines dropped it).
        let text = raw[n].trim_start()[hashes..].trim();
        let slug = slug(text);
        let count = seen.entry(slug.clone()).or_insert(0);
        out.insert(if *count == 0 {
            slug.clone()
        } else {
            format!("{slug}-{count}")
        });
        *count += 1;
    }
    out
}

/// GitHub's anchor for a heading's text.
pub fn slug(text: &str) -> String {
    text.chars()
        .filter_map(|c| {
            if c.is_alphanumeric() || c == '-' || c == '_' {
                Some(c.to_lowercase().collect::<String>())
            } else if c == ' ' {
                Some("-".to_string())
            } else {
                None
            }
        })
        .collect()
}

/// The rows of the first table under the heading `heading` (its text, without the `#`s): each
/// row's cells, trimmed; the header row and the separator row left out.
pub fn table_under(page: &str, heading: &str) -> Vec<Vec<String>> {
    let mut lines = page.lines().skip_while(|l| {
        let t = l.trim_start().trim_start_matches('#');
        !(l.trim_start().starts_with('#') && t.trim() == heading)
    });
    lines.next();
    let rows: Vec<Vec<String>> = lines
        .skip_while(|l| !l.trim_start().starts_with('|'))
        .take_while(|l| l.trim_start().starts_with('|'))
        .map(|l| {
            l.trim()
                .trim_matches('|')
                .split('|')
                .map(|c| c.trim().to_string())
                .collect()
        })
        .collect();
    rows.into_iter().skip(2).collect()
}

/// The names in backticks in `text` (`` `nri-proto/` `` -> `nri-proto/`).
pub fn code_spans(text: &str) -> Vec<String> {
    text.split('`')
        .skip(1)
        .step_by(2)
        .map(str::to_string)
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn links_outside_code_with_titles_and_references() {
        let page = "See [a](docs/a.md) and ![img](pic.png \"t\").\n\
                    `[not](code.md)`\n\
                    ```\n[not](fenced.md)\n```\n\
                    [ref]: <other.md#x>\n";
        let found: Vec<(String, usize)> = links(page)
            .into_iter()
            .map(|l| (l.target, l.line))
            .collect();
        assert_eq!(
            found,
            [
                ("docs/a.md".to_string(), 1),
                ("pic.png".to_string(), 1),
                ("other.md#x".to_string(), 6)
            ]
        );
    }

    #[test]
    fn anchors_follow_github() {
        let page = "# nri-accel\n## Kubelet restarts, wiped directories, shutdown\n\
                    ## `status`\n## Status\n```\n# not a heading\n```\n";
        let a = anchors(page);
        for want in [
            "nri-accel",
            "kubelet-restarts-wiped-directories-shutdown",
            "status",
            "status-1",
        ] {
            assert!(a.contains(want), "{want} not in {a:?}");
        }
        assert!(!a.contains("not-a-heading"), "{a:?}");
    }

    #[test]
    fn a_table_under_a_heading() {
        let page = "## Tour\ntext\n| folder | what |\n| --- | --- |\n| `a/`, `b/` | x |\n| `c/` | y |\n\nafter\n";
        let rows = table_under(page, "Tour");
        assert_eq!(rows.len(), 2);
        assert_eq!(code_spans(&rows[0][0]), ["a/", "b/"]);
    }
}
