//! A map from YAML paths to positions, so validation errors found after
//! parsing (a duplicate pool name, a profile past the last slot) still point
//! at a line and column.
//!
//! The config text is parsed a second time into a shape-agnostic tree of
//! `Spanned` nodes; only done when validation has something to report.

use std::fmt;

use serde::de::{self, Deserialize, Deserializer, MapAccess, SeqAccess, Visitor};
use serde_saphyr::Spanned;

use super::error::Position;

/// One step of a field path: a mapping key or a sequence index.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) enum Step {
    /// A mapping key.
    Key(&'static str),
    /// A sequence index.
    Index(usize),
}

/// Renders a path as `pools[1].family.replicas`.
pub(crate) fn render_path(path: &[Step]) -> String {
    let mut out = String::new();
    for step in path {
        match step {
            Step::Key(k) => {
                if !out.is_empty() {
                    out.push('.');
                }
                out.push_str(k);
            }
            Step::Index(i) => out.push_str(&format!("[{i}]")),
        }
    }
    out
}

/// A YAML node with the position of its children.
#[derive(Debug, Default)]
pub(crate) enum Tree {
    /// A scalar or null.
    #[default]
    Leaf,
    /// A mapping, keys rendered as strings.
    Map(Vec<(String, Spanned<Tree>)>),
    /// A sequence.
    Seq(Vec<Spanned<Tree>>),
}

impl Tree {
    /// The position of the node at `path`, or of its nearest ancestor that is
    /// written in the file (a default has no position of its own).
    pub(crate) fn locate(&self, path: &[Step]) -> Option<Position> {
        let mut node = self;
        let mut best = None;
        for step in path {
            let child = match (node, step) {
                (Tree::Map(entries), Step::Key(k)) => {
                    entries.iter().find(|(name, _)| name == k).map(|(_, v)| v)
                }
                (Tree::Seq(items), Step::Index(i)) => items.get(*i),
                _ => None,
            };
            let Some(child) = child else { break };
            let loc = child.referenced;
            if loc.line() > 0 {
                best = Some(Position {
                    line: loc.line(),
                    column: loc.column(),
                });
            }
            node = &child.value;
        }
        best
    }
}

impl Tree {
    /// The path (`claims_api.max_message_bytes`) of the value written at `at`, or else of the
    /// first value written after `at` on the same line: a parser error points at a value (or at
    /// the start of its flow mapping) but does not name its field.
    pub(crate) fn path_at(&self, at: Position) -> Option<String> {
        let mut best: Option<(u64, String)> = None;
        self.walk(&mut String::new(), &mut |pos, path| {
            if pos.line == at.line && pos.column >= at.column {
                let distance = pos.column - at.column;
                if best.as_ref().is_none_or(|(d, _)| distance < *d) {
                    best = Some((distance, path.to_string()));
                }
            }
        });
        best.map(|(_, path)| path)
    }

    fn walk(&self, path: &mut String, visit: &mut dyn FnMut(Position, &str)) {
        let mut child = |path: &mut String, step: &str, node: &Spanned<Tree>| {
            let len = path.len();
            path.push_str(step);
            let loc = node.referenced;
            if loc.line() > 0 {
                visit(
                    Position {
                        line: loc.line(),
                        column: loc.column(),
                    },
                    path,
                );
            }
            node.value.walk(path, visit);
            path.truncate(len);
        };
        match self {
            Tree::Leaf => {}
            Tree::Map(entries) => {
                for (key, node) in entries {
                    let step = if path.is_empty() {
                        key.clone()
                    } else {
                        format!(".{key}")
                    };
                    child(path, &step, node);
                }
            }
            Tree::Seq(items) => {
                for (i, node) in items.iter().enumerate() {
                    child(path, &format!("[{i}]"), node);
                }
            }
        }
    }
}

struct TreeVisitor;

impl<'de> Visitor<'de> for TreeVisitor {
    type Value = Tree;

    fn expecting(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("any YAML node")
    }
    fn visit_bool<E: de::Error>(self, _: bool) -> Result<Tree, E> {
        Ok(Tree::Leaf)
    }
    fn visit_i64<E: de::Error>(self, _: i64) -> Result<Tree, E> {
        Ok(Tree::Leaf)
    }
    fn visit_u64<E: de::Error>(self, _: u64) -> Result<Tree, E> {
        Ok(Tree::Leaf)
    }
    fn visit_f64<E: de::Error>(self, _: f64) -> Result<Tree, E> {
        Ok(Tree::Leaf)
    }
    fn visit_str<E: de::Error>(self, _: &str) -> Result<Tree, E> {
        Ok(Tree::Leaf)
    }
    fn visit_bytes<E: de::Error>(self, _: &[u8]) -> Result<Tree, E> {
        Ok(Tree::Leaf)
    }
    fn visit_unit<E: de::Error>(self) -> Result<Tree, E> {
        Ok(Tree::Leaf)
    }
    fn visit_none<E: de::Error>(self) -> Result<Tree, E> {
        Ok(Tree::Leaf)
    }
    fn visit_some<D: Deserializer<'de>>(self, d: D) -> Result<Tree, D::Error> {
        Tree::deserialize(d)
    }
    fn visit_seq<A: SeqAccess<'de>>(self, mut seq: A) -> Result<Tree, A::Error> {
        let mut items = Vec::new();
        while let Some(item) = seq.next_element::<Spanned<Tree>>()? {
            items.push(item);
        }
        Ok(Tree::Seq(items))
    }
    fn visit_map<A: MapAccess<'de>>(self, mut map: A) -> Result<Tree, A::Error> {
        let mut entries = Vec::new();
        while let Some(key) = map.next_key::<Key>()? {
            let value = map.next_value::<Spanned<Tree>>()?;
            entries.push((key.0, value));
        }
        Ok(Tree::Map(entries))
    }
}

impl<'de> Deserialize<'de> for Tree {
    fn deserialize<D: Deserializer<'de>>(d: D) -> Result<Tree, D::Error> {
        d.deserialize_any(TreeVisitor)
    }
}

/// A mapping key of any scalar type, as text.
struct Key(String);

impl<'de> Deserialize<'de> for Key {
    fn deserialize<D: Deserializer<'de>>(d: D) -> Result<Key, D::Error> {
        struct KeyVisitor;
        impl Visitor<'_> for KeyVisitor {
            type Value = Key;
            fn expecting(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
                f.write_str("a scalar key")
            }
            fn visit_str<E: de::Error>(self, v: &str) -> Result<Key, E> {
                Ok(Key(v.to_string()))
            }
            fn visit_bool<E: de::Error>(self, v: bool) -> Result<Key, E> {
                Ok(Key(v.to_string()))
            }
            fn visit_i64<E: de::Error>(self, v: i64) -> Result<Key, E> {
                Ok(Key(v.to_string()))
            }
            fn visit_u64<E: de::Error>(self, v: u64) -> Result<Key, E> {
                Ok(Key(v.to_string()))
            }
            fn visit_f64<E: de::Error>(self, v: f64) -> Result<Key, E> {
                Ok(Key(v.to_string()))
            }
            fn visit_unit<E: de::Error>(self) -> Result<Key, E> {
                Ok(Key(String::new()))
            }
        }
        d.deserialize_any(KeyVisitor)
    }
}
