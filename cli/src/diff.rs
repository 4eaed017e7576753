//! `zt diff`: the differences in decoded content between two sources, as
//! data, so the text and the `--json` output say the same thing.

use std::path::Path;

use serde_json::{json, Value as Json};
use zt::Source;

/// One difference between source A and source B.
#[derive(Debug, PartialEq)]
pub enum Difference {
    /// A tensor only A has.
    OnlyInA { name: String },
    /// A tensor only B has.
    OnlyInB { name: String },
    /// Same name, different layout or shape (parts not compared).
    Object {
        name: String,
        a: (String, Vec<u64>),
        b: (String, Vec<u64>),
    },
    /// Same layout and shape, different number of parts.
    PartCount { name: String, a: usize, b: usize },
    /// A part of A's tensor that B's tensor lacks.
    PartOnlyInA { name: String, part: String },
    /// Same part, different dtype or shape.
    Part {
        name: String,
        part: String,
        a: (String, Vec<u64>),
        b: (String, Vec<u64>),
    },
    /// Same part, dtype and shape; different decoded bytes.
    Contents { name: String, part: String },
}

/// Every difference, in name order (the union of both sources' names).
pub fn differences(sa: &Source, sb: &Source) -> zt::Result<Vec<Difference>> {
    let mut out = Vec::new();
    let mut names: Vec<&str> = sa.names().chain(sb.names()).collect();
    names.sort_unstable();
    names.dedup();
    for name in names {
        let owned = name.to_string();
        let (ta, tb) = match (sa.get(name), sb.get(name)) {
            (Some(x), Some(y)) => (x, y),
            (Some(_), None) => {
                out.push(Difference::OnlyInA { name: owned });
                continue;
            }
            _ => {
                out.push(Difference::OnlyInB { name: owned });
                continue;
            }
        };
        if ta.layout() != tb.layout() || ta.shape() != tb.shape() {
            out.push(Difference::Object {
                name: owned,
                a: (ta.layout().to_string(), ta.shape().to_vec()),
                b: (tb.layout().to_string(), tb.shape().to_vec()),
            });
            continue;
        }
        let pa: Vec<_> = ta.parts().collect();
        let pb: Vec<_> = tb.parts().collect();
        if pa.len() != pb.len() {
            out.push(Difference::PartCount {
                name: owned,
                a: pa.len(),
                b: pb.len(),
            });
            continue;
        }
        for p in &pa {
            let part = p.name().to_string();
            let Some(q) = tb.part(p.name()) else {
                out.push(Difference::PartOnlyInA {
                    name: owned.clone(),
                    part,
                });
                continue;
            };
            if p.dtype() != q.dtype() || p.shape() != q.shape() {
                out.push(Difference::Part {
                    name: owned.clone(),
                    part,
                    a: (p.dtype().to_string(), p.shape().to_vec()),
                    b: (q.dtype().to_string(), q.shape().to_vec()),
                });
            } else if p.bytes()? != q.bytes()? {
                out.push(Difference::Contents {
                    name: owned.clone(),
                    part,
                });
            }
        }
    }
    Ok(out)
}

impl Difference {
    /// The line `zt diff` prints (`-` only in A, `+` only in B, `~` changed).
    pub fn text(&self, a: &Path, b: &Path) -> String {
        match self {
            Difference::OnlyInA { name } => format!("- {name} (only in {})", a.display()),
            Difference::OnlyInB { name } => format!("+ {name} (only in {})", b.display()),
            Difference::Object { name, a, b } => {
                format!("~ {name}: {} {:?} vs {} {:?}", a.0, a.1, b.0, b.1)
            }
            Difference::PartCount { name, a, b } => format!("~ {name}: {a} parts vs {b}"),
            Difference::PartOnlyInA { name, part } => {
                format!("~ {name}: part {part} only in {}", a.display())
            }
            Difference::Part { name, part, a, b } => {
                format!("~ {name}/{part}: {} {:?} vs {} {:?}", a.0, a.1, b.0, b.1)
            }
            Difference::Contents { name, part } => format!("~ {name}/{part}: contents differ"),
        }
    }

    /// The `--json` form (schema in docs/CLI.md).
    fn json(&self) -> Json {
        match self {
            Difference::OnlyInA { name } => json!({"kind": "only_in_a", "name": name}),
            Difference::OnlyInB { name } => json!({"kind": "only_in_b", "name": name}),
            Difference::Object { name, a, b } => json!({
                "kind": "object", "name": name,
                "a": {"layout": a.0, "shape": a.1}, "b": {"layout": b.0, "shape": b.1},
            }),
            Difference::PartCount { name, a, b } => {
                json!({"kind": "part_count", "name": name, "a": a, "b": b})
            }
            Difference::PartOnlyInA { name, part } => {
                json!({"kind": "part_only_in_a", "name": name, "part": part})
            }
            Difference::Part { name, part, a, b } => json!({
                "kind": "part", "name": name, "part": part,
                "a": {"dtype": a.0, "shape": a.1}, "b": {"dtype": b.0, "shape": b.1},
            }),
            Difference::Contents { name, part } => {
                json!({"kind": "contents", "name": name, "part": part})
            }
        }
    }
}

/// `zt diff --json`: both files, whether they hold the same content, and
/// every difference.
pub fn to_json(a: &Path, b: &Path, differences: &[Difference]) -> Json {
    json!({
        "a": a.display().to_string(),
        "b": b.display().to_string(),
        "same": differences.is_empty(),
        "differences": differences.iter().map(Difference::json).collect::<Vec<_>>(),
    })
}
