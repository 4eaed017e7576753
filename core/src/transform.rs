//! A conversion's options over its source: which tensors (`select`), under
//! which names (`rename`), in which floating type (`dtype`). Applied as a
//! view of the source ([`Source::transform`]): the tensors left out are
//! dropped from the catalog, a rename renames the catalog's objects, and a
//! cast replaces a floating part's payload by a [`crate::cast::Cast`]
//! decoder over the original one. Nothing is read: every writer then sees
//! an ordinary source and writes it as it writes any other.

use crate::cast::{castable, Cast};
use crate::catalog::{Part, Payload};
use crate::dtype::{DType, Kind};
use crate::error::{Context, Error, Result};
use crate::rule::Rule;
use crate::source::Source;
use std::sync::Arc;

/// How to rename tensors: exact names first (`map`), then a prefix
/// stripped from every other name that has it.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Rename {
    /// Strip this prefix from the names that start with it.
    pub strip_prefix: Option<String>,
    /// `(old, new)`: the tensor named `old` is written as `new`.
    pub map: Vec<(String, String)>,
}

impl Rename {
    /// Whether it renames nothing.
    pub fn is_empty(&self) -> bool {
        self.strip_prefix.as_deref().is_none_or(str::is_empty) && self.map.is_empty()
    }

    /// The new name of `name`, `None` when it keeps its own.
    fn apply(&self, name: &str) -> Option<String> {
        if let Some((_, new)) = self.map.iter().find(|(old, _)| old == name) {
            return Some(new.clone());
        }
        let prefix = self.strip_prefix.as_deref().filter(|p| !p.is_empty())?;
        name.strip_prefix(prefix).map(str::to_string)
    }
}

/// What a conversion does to its source's tensors.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Transform {
    /// Glob patterns over tensor names (`*` any run of characters, `?` one,
    /// `[abc]`, `[a-z]`, `[!abc]` one of or none of a set): a tensor is
    /// kept when any pattern matches its whole name. Empty keeps every
    /// tensor. A pattern that matches no tensor is an error naming it.
    pub select: Vec<String>,
    /// New names for the tensors kept; two tensors given one name is an
    /// error.
    pub rename: Rename,
    /// Cast every floating tensor (`f64`, `f32`, `f16`, `bf16`) to this
    /// type, as torch rounds; other tensors are unchanged.
    pub dtype: Option<DType>,
}

impl Transform {
    /// Whether it leaves a source as it is.
    pub fn is_identity(&self) -> bool {
        self.select.is_empty() && self.rename.is_empty() && self.dtype.is_none()
    }
}

/// The `dtype` of a conversion by name: `bf16`/`bfloat16`, `f16`/`float16`/
/// `half`, `f32`/`float32`/`float`, `f64`/`float64`/`double` (a `torch.`
/// prefix allowed).
pub fn parse_cast_dtype(name: &str) -> Result<DType> {
    let bare = name.trim().strip_prefix("torch.").unwrap_or(name.trim());
    match bare.to_ascii_lowercase().as_str() {
        "bf16" | "bfloat16" => Ok(DType::BF16),
        "f16" | "fp16" | "float16" | "half" => Ok(DType::F16),
        "f32" | "fp32" | "float32" | "float" => Ok(DType::F32),
        "f64" | "fp64" | "float64" | "double" => Ok(DType::F64),
        _ => Err(Error::Write {
            rule: Rule::WRITE_CAST,
            ctx: Context::default(),
            reason: format!("dtype {name:?}: zt casts to bf16, f16, f32 or f64"),
        }),
    }
}

/// Whether the glob `pattern` matches the whole of `name` (see
/// [`Transform::select`]); `Err` for a `[` that is never closed.
pub fn glob_match(pattern: &str, name: &str) -> std::result::Result<bool, String> {
    let p: Vec<char> = pattern.chars().collect();
    let n: Vec<char> = name.chars().collect();
    // Iterative matching with one backtrack point (the last `*`): linear
    // in practice, quadratic at worst, never exponential.
    let (mut pi, mut ni) = (0usize, 0usize);
    let mut star: Option<(usize, usize)> = None;
    loop {
        if pi < p.len() {
            match p[pi] {
                '*' => {
                    star = Some((pi, ni));
                    pi += 1;
                    continue;
                }
                '?' if ni < n.len() => {
                    pi += 1;
                    ni += 1;
                    continue;
                }
                '[' => {
                    let (set_end, matched) = class(&p, pi, n.get(ni).copied())?;
                    if ni < n.len() && matched {
                        pi = set_end;
                        ni += 1;
                        continue;
                    }
                }
                c if c != '?' && ni < n.len() && n[ni] == c => {
                    pi += 1;
                    ni += 1;
                    continue;
                }
                _ => {}
            }
        } else if ni == n.len() {
            return Ok(true);
        }
        match star {
            Some((sp, sn)) if sn < n.len() => {
                star = Some((sp, sn + 1));
                pi = sp + 1;
                ni = sn + 1;
            }
            _ => {
                // Check the rest of the pattern for an unclosed class, so
                // a malformed pattern is refused whatever the name.
                let mut i = pi;
                while i < p.len() {
                    if p[i] == '[' {
                        i = class(&p, i, None)?.0;
                    } else {
                        i += 1;
                    }
                }
                return Ok(false);
            }
        }
    }
}

/// The class `[...]` opening at `p[at]`: where it ends (past `]`) and
/// whether `c` is in it.
fn class(p: &[char], at: usize, c: Option<char>) -> std::result::Result<(usize, bool), String> {
    let mut i = at + 1;
    let negate = matches!(p.get(i), Some('!' | '^'));
    if negate {
        i += 1;
    }
    let mut matched = false;
    let mut first = true;
    loop {
        let Some(&x) = p.get(i) else {
            return Err("a '[' is never closed".into());
        };
        if x == ']' && !first {
            i += 1;
            break;
        }
        first = false;
        if p.get(i + 1) == Some(&'-') && p.get(i + 2).is_some_and(|&y| y != ']') {
            let y = p[i + 2];
            matched |= c.is_some_and(|c| x <= c && c <= y);
            i += 3;
        } else {
            matched |= c == Some(x);
            i += 1;
        }
    }
    Ok((i, matched != negate))
}

impl Source {
    /// This source as `transform` says: the tensors `select` keeps, in
    /// listing order, renamed, floating ones cast. Metadata only: nothing
    /// is read until a tensor is.
    pub fn transform(&self, transform: &Transform) -> Result<Source> {
        let ctx = || self.files.first().map(Context::file).unwrap_or_default();
        let positions: Vec<usize> = if transform.select.is_empty() {
            (0..self.len()).collect()
        } else {
            let mut hit = vec![false; transform.select.len()];
            let mut kept = Vec::new();
            for (position, name) in self.names().enumerate() {
                let mut keep = false;
                for (i, pattern) in transform.select.iter().enumerate() {
                    let matched = glob_match(pattern, name).map_err(|why| Error::Write {
                        rule: Rule::WRITE_SELECT,
                        ctx: ctx(),
                        reason: format!("select pattern {pattern:?}: {why}"),
                    })?;
                    hit[i] |= matched;
                    keep |= matched;
                }
                if keep {
                    kept.push(position);
                }
            }
            // A malformed pattern is refused even with no tensor to match.
            for pattern in &transform.select {
                glob_match(pattern, "").map_err(|why| Error::Write {
                    rule: Rule::WRITE_SELECT,
                    ctx: ctx(),
                    reason: format!("select pattern {pattern:?}: {why}"),
                })?;
            }
            if let Some(i) = hit.iter().position(|h| !h) {
                return Err(Error::Write {
                    rule: Rule::WRITE_SELECT,
                    ctx: ctx(),
                    reason: format!(
                        "select pattern {:?} matches no tensor (of {})",
                        transform.select[i],
                        self.len()
                    ),
                });
            }
            kept
        };
        let mut out = self.select(&positions);
        if !transform.rename.is_empty() {
            let rename = &transform.rename;
            for (old, _) in &rename.map {
                if out.get(old).is_none() {
                    return Err(Error::Write {
                        rule: Rule::WRITE_RENAME,
                        ctx: ctx(),
                        reason: format!("rename {old:?}: no tensor of that name is converted"),
                    });
                }
            }
            if let Some(empty) = out.names().find(|n| rename.apply(n).as_deref() == Some("")) {
                return Err(Error::Write {
                    rule: Rule::WRITE_RENAME,
                    ctx: ctx().tensor(empty),
                    reason: "the rename leaves this tensor no name".into(),
                });
            }
            let old: Vec<String> = out.names().map(str::to_string).collect();
            out.rename_objects(|n| rename.apply(n))
                .map_err(|(first, second)| Error::Write {
                    rule: Rule::WRITE_RENAME,
                    ctx: ctx(),
                    reason: format!(
                        "the rename gives {:?} and {:?} one name, {:?}",
                        old[first],
                        old[second],
                        rename
                            .apply(&old[second])
                            .unwrap_or_else(|| old[second].clone())
                    ),
                })?;
        }
        if let Some(to) = transform.dtype {
            if !castable(to) {
                return Err(Error::Write {
                    rule: Rule::WRITE_CAST,
                    ctx: ctx(),
                    reason: format!("zt casts to bf16, f16, f32 or f64, not {to}"),
                });
            }
            let mut replaced = Vec::new();
            for slot in 0..out.len() {
                let object = out.slot_object(slot);
                if object.layout != "dense" {
                    continue;
                }
                for (p, part) in object.parts.iter().enumerate() {
                    let from = part.dtype;
                    if from == to || !matches!(from.kind(), Kind::Float | Kind::MlFloat) {
                        continue;
                    }
                    let size = from.size().unwrap_or(0);
                    if !castable(from) || size == 0 || part.payload.len() % size != 0 {
                        return Err(Error::Write {
                            rule: Rule::WRITE_CAST,
                            ctx: ctx().tensor(&object.name),
                            reason: format!("zt casts f64, f32, f16 and bf16 tensors, not {from}"),
                        });
                    }
                    let cast = Cast {
                        payload: part.payload.clone(),
                        from,
                        to,
                    };
                    let decoded_len = cast.decoded_len();
                    replaced.push((
                        slot,
                        p,
                        Part {
                            dtype: to,
                            payload: Payload::Decoded {
                                decoder: Arc::new(cast),
                                decoded_len,
                            },
                            ..part.clone()
                        },
                    ));
                }
            }
            out.replace_parts(replaced);
        }
        Ok(out)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::catalog::{Catalog, Object};
    use crate::limits::Limits;
    use crate::store::Store;
    use std::io::Write;

    #[test]
    fn globs_match_whole_names() {
        let m = |p: &str, n: &str| glob_match(p, n).unwrap();
        assert!(m("model.*", "model.layers.0.weight"));
        assert!(!m("model.*", "optim.model.x"));
        assert!(m("*.weight", "a.b.weight"));
        assert!(!m("*.weight", "a.weight.bias"));
        assert!(m("*", ""));
        assert!(m("a?c", "abc"));
        assert!(!m("a?c", "ac"));
        assert!(m("layers.[0-2].*", "layers.1.w"));
        assert!(!m("layers.[0-2].*", "layers.3.w"));
        assert!(m("layers.[!0-2].*", "layers.3.w"));
        assert!(m("x[]]y", "x]y"));
        assert!(m("*a*b*c", "xxaxxbxxc"));
        assert!(!m("*a*b*c", "xxaxxbxxcx"));
        assert!(m("exact", "exact"));
        assert!(!m("exact", "exactly"));
        assert!(glob_match("a[bc", "ab").is_err());
        assert!(glob_match("zz*a[bc", "ab").is_err());
    }

    #[test]
    fn cast_names_parse() {
        assert_eq!(parse_cast_dtype("bf16").unwrap(), DType::BF16);
        assert_eq!(parse_cast_dtype("torch.bfloat16").unwrap(), DType::BF16);
        assert_eq!(parse_cast_dtype("float16").unwrap(), DType::F16);
        assert_eq!(parse_cast_dtype("F32").unwrap(), DType::F32);
        assert_eq!(parse_cast_dtype("double").unwrap(), DType::F64);
        assert_eq!(
            parse_cast_dtype("int8").unwrap_err().rule(),
            Some(Rule::WRITE_CAST)
        );
    }

    /// A file of f32 `a.x` = [1.0, 1 + 2^-8 (a bf16 tie), NaN, f32::MAX],
    /// i32 `a.n` = [7, -7] and f32 `b.y` = [3.0], read as one source.
    fn source(dir: &std::path::Path) -> Source {
        let x: [f32; 4] = [1.0, f32::from_bits(0x3F80_8000), f32::NAN, f32::MAX];
        let mut bytes: Vec<u8> = x.iter().flat_map(|v| v.to_le_bytes()).collect();
        bytes.extend([7i32, -7].iter().flat_map(|v| v.to_le_bytes()));
        bytes.extend(3.0f32.to_le_bytes());
        let path = dir.join("t.bin");
        std::fs::File::create(&path)
            .unwrap()
            .write_all(&bytes)
            .unwrap();
        let store = Arc::new(Store::open(&path).unwrap());
        let stored = |offset, len| Payload::Stored {
            store: store.clone(),
            offset,
            len,
        };
        let catalog = Catalog {
            objects: vec![
                Object::dense("a.x", DType::F32, vec![4], stored(0, 16)),
                Object::dense("a.n", DType::I32, vec![2], stored(16, 8)),
                Object::dense("b.y", DType::F32, vec![1], stored(24, 4)),
            ],
            ..Default::default()
        };
        Source::from_catalog("test", store, catalog, Limits::default()).unwrap()
    }

    fn names(s: &Source) -> Vec<&str> {
        s.names().collect()
    }

    #[test]
    fn select_keeps_the_union_and_refuses_a_pattern_matching_nothing() {
        let dir = tempfile::tempdir().unwrap();
        let src = source(dir.path());
        let t = |select: &[&str]| Transform {
            select: select.iter().map(|s| s.to_string()).collect(),
            ..Default::default()
        };
        assert_eq!(names(&src.transform(&t(&["a.*"])).unwrap()), ["a.x", "a.n"]);
        assert_eq!(
            names(&src.transform(&t(&["b.*", "a.n"])).unwrap()),
            ["a.n", "b.y"]
        );
        let err = src.transform(&t(&["a.*", "optim.*"])).unwrap_err();
        assert_eq!(err.rule(), Some(Rule::WRITE_SELECT));
        assert!(err.to_string().contains("optim.*"), "{err}");
        let err = src.transform(&t(&["a[x"])).unwrap_err();
        assert_eq!(err.rule(), Some(Rule::WRITE_SELECT));
        // The selection reads as the source does.
        let kept = src.transform(&t(&["b.y"])).unwrap();
        assert_eq!(
            kept.tensor("b.y").unwrap().data().unwrap().bytes().unwrap()[..],
            3.0f32.to_le_bytes()
        );
        assert!(kept.get("a.x").is_none());
    }

    #[test]
    fn rename_strips_a_prefix_or_maps_and_refuses_duplicates() {
        let dir = tempfile::tempdir().unwrap();
        let src = source(dir.path());
        let strip = Transform {
            rename: Rename {
                strip_prefix: Some("a.".into()),
                map: vec![],
            },
            ..Default::default()
        };
        let out = src.transform(&strip).unwrap();
        assert_eq!(names(&out), ["x", "n", "b.y"]);
        assert_eq!(
            out.tensor("n").unwrap().data().unwrap().bytes().unwrap()[..],
            [7i32.to_le_bytes(), (-7i32).to_le_bytes()].concat()[..]
        );
        assert!(out.get("a.n").is_none());
        let map = Transform {
            rename: Rename {
                strip_prefix: None,
                map: vec![("b.y".into(), "y".into())],
            },
            ..Default::default()
        };
        assert_eq!(names(&src.transform(&map).unwrap()), ["a.x", "a.n", "y"]);
        // Two tensors given one name.
        let clash = Transform {
            rename: Rename {
                strip_prefix: Some("a.".into()),
                map: vec![("b.y".into(), "x".into())],
            },
            ..Default::default()
        };
        let err = src.transform(&clash).unwrap_err();
        assert_eq!(err.rule(), Some(Rule::WRITE_RENAME));
        assert!(err.to_string().contains("\"a.x\" and \"b.y\""), "{err}");
        // A mapped name that is not converted, and an empty name.
        let missing = Transform {
            select: vec!["a.*".into()],
            rename: Rename {
                strip_prefix: None,
                map: vec![("b.y".into(), "y".into())],
            },
            ..Default::default()
        };
        assert_eq!(
            src.transform(&missing).unwrap_err().rule(),
            Some(Rule::WRITE_RENAME)
        );
        let empty = Transform {
            rename: Rename {
                strip_prefix: Some("b.y".into()),
                map: vec![],
            },
            ..Default::default()
        };
        assert_eq!(
            src.transform(&empty).unwrap_err().rule(),
            Some(Rule::WRITE_RENAME)
        );
    }

    #[test]
    fn cast_converts_floating_tensors_only() {
        let dir = tempfile::tempdir().unwrap();
        let src = source(dir.path());
        let t = Transform {
            dtype: Some(DType::BF16),
            ..Default::default()
        };
        let out = src.transform(&t).unwrap();
        let x = out.tensor("a.x").unwrap();
        let part = x.data().unwrap();
        assert_eq!(part.dtype(), DType::BF16);
        assert_eq!(part.nbytes(), 8);
        let bits: Vec<u16> = part
            .bytes()
            .unwrap()
            .chunks_exact(2)
            .map(|c| u16::from_le_bytes([c[0], c[1]]))
            .collect();
        assert_eq!(bits, [0x3F80, 0x3F80, 0x7FC0, 0x7F80]);
        // A range of elements casts only those.
        assert_eq!(
            part.storage_range(2, 4).unwrap()[..],
            [0x80, 0x3F, 0xC0, 0x7F]
        );
        let n = out.tensor("a.n").unwrap().data().unwrap();
        assert_eq!(n.dtype(), DType::I32);
        assert!(matches!(n.payload(), Payload::Stored { .. }));
        assert_eq!(out.total_bytes(), 8 + 8 + 2);
        assert_eq!(
            src.transform(&Transform {
                dtype: Some(DType::I8),
                ..Default::default()
            })
            .unwrap_err()
            .rule(),
            Some(Rule::WRITE_CAST)
        );
        // All three together.
        let all = Transform {
            select: vec!["a.x".into(), "b.*".into()],
            rename: Rename {
                strip_prefix: Some("a.".into()),
                map: vec![],
            },
            dtype: Some(DType::F16),
        };
        let out = src.transform(&all).unwrap();
        assert_eq!(names(&out), ["x", "b.y"]);
        assert_eq!(
            out.tensor("b.y").unwrap().data().unwrap().bytes().unwrap()[..],
            0x4200u16.to_le_bytes()
        );
    }
}
