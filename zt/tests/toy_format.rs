//! The "Adding a format" steps of docs/ARCHITECTURE.md, followed
//! literally for a toy format outside the `formats` crate: one module (its
//! reader, writer, rules and `PLUGIN`) and one registry entry. Nothing
//! else is touched, and the registry then detects, opens, converts to and
//! from, checks requests and lists rules for it as for any built-in format,
//! and its fuzz target and seeds come from the same entry.

use std::path::Path;
use std::sync::OnceLock;

use zt::{Error, Registry, TensorIn, WriteOptions};

/// The toy format, as a plugin's directory would hold it: `TOY1`, a u32
/// count, then per tensor a u16 name length, the name, a dtype code, a u8
/// rank, the dims as u64, a u64 byte length and the bytes (little-endian,
/// unaligned: read through the core's copy path when they cannot be
/// mapped).
mod toy {
    use std::path::Path;
    use zt::catalog::{Catalog, Object, Payload, Value};
    use zt::plugin::Seed;
    use zt::publish::publish;
    use zt::write::{FormatWriter, MetadataCaps, WriteOptions, WriterCaps};
    use zt::{Checkpoint, Context, DType, Error, Format, OpenInput, Plugin, Probe, Reader};
    use zt::{FuzzTarget, Result, Rule, TensorIn};

    pub mod rules {
        use zt::Rule;
        /// The header is not a toy header.
        pub const HEADER: Rule = Rule::new("toy.Header");
        /// A dtype code the toy format does not define.
        pub const DTYPE: Rule = Rule::new("toy.DType");
        /// Every rule above.
        pub const RULES: &[Rule] = &[HEADER, DTYPE];
    }

    const MAGIC: &[u8; 4] = b"TOY1";
    const DTYPES: [DType; 3] = [DType::F32, DType::U8, DType::I64];

    pub struct Toy;
    pub struct ToyWriter;

    pub static PLUGIN: Plugin = Plugin {
        name: "toy",
        readers: &[Reader {
            format: &Toy,
            detect_rank: 15,
        }],
        writers: &[&ToyWriter],
        rules: &[("toy", rules::RULES)],
        checkpoints: &[Checkpoint {
            name: "model.toy",
            preference: 90, // after every built-in name (zarr's run to 42)
        }],
    };

    /// A cursor over the header that refuses to read past the file.
    struct Cursor<'a> {
        input: &'a OpenInput<'a>,
        at: u64,
    }

    impl Cursor<'_> {
        fn take(&mut self, n: u64) -> Result<Vec<u8>> {
            let bytes =
                self.input.store.read(self.at, n).map_err(|_| {
                    Error::header(self.input.ctx(), rules::HEADER, "truncated header")
                })?;
            self.at += n;
            Ok(bytes.into_owned())
        }
        fn uint(&mut self, n: u64) -> Result<u64> {
            let bytes = self.take(n)?;
            let mut le = [0u8; 8];
            le[..n as usize].copy_from_slice(&bytes);
            Ok(u64::from_le_bytes(le))
        }
    }

    impl Format for Toy {
        fn name(&self) -> &'static str {
            "toy"
        }
        fn extensions(&self) -> &'static [&'static str] {
            &["toy"]
        }
        fn sniff(&self, probe: &Probe<'_>) -> bool {
            probe.head.starts_with(MAGIC)
        }
        fn open(&self, input: &OpenInput<'_>) -> Result<Catalog> {
            let ctx = input.ctx();
            let mut c = Cursor { input, at: 0 };
            if c.take(4)? != MAGIC {
                return Err(Error::header(ctx, rules::HEADER, "no TOY1 magic"));
            }
            let count = c.uint(4)?;
            input.limits.check_tensors(&ctx, count)?;
            let mut objects = Vec::new();
            for _ in 0..count {
                let name_len = c.uint(2)?;
                let name = String::from_utf8(c.take(name_len)?)
                    .map_err(|_| Error::header(ctx.clone(), rules::HEADER, "name not UTF-8"))?;
                let code = c.uint(1)? as usize;
                let dtype = *DTYPES.get(code).ok_or_else(|| {
                    Error::header(ctx.clone(), rules::DTYPE, format!("dtype code {code}"))
                })?;
                let rank = c.uint(1)?;
                input.limits.check_rank(&ctx, rank as usize)?;
                let shape = (0..rank).map(|_| c.uint(8)).collect::<Result<Vec<_>>>()?;
                let len = c.uint(8)?;
                // The source checks the payload against the file and the
                // shape, as it does every plugin's.
                let payload = Payload::Stored {
                    store: std::sync::Arc::clone(input.store),
                    offset: c.at,
                    len,
                };
                c.at = c
                    .at
                    .checked_add(len)
                    .ok_or_else(|| Error::header(ctx.clone(), rules::HEADER, "length overflows"))?;
                objects.push(Object::dense(name, dtype, shape, payload));
            }
            Ok(Catalog {
                objects,
                ..Catalog::default()
            })
        }
        /// Its fuzz target: the fuzz crate runs this reader on every input
        /// under the name `toy`, seeded from `fuzz/seeds/toy`, which
        /// [`seeds`] writes (`--example make-seeds`).
        fn fuzz(&self) -> Option<FuzzTarget> {
            Some(FuzzTarget {
                make_seeds: Some(seeds),
                ..FuzzTarget::new("toy", &[])
            })
        }
    }

    /// The toy's fuzz seeds, made in Rust: one tensor of each dtype, and a
    /// header naming a dtype code the format does not define.
    pub fn seeds() -> Vec<Seed> {
        let file = |code: u8| {
            let mut b = MAGIC.to_vec();
            b.extend_from_slice(&1u32.to_le_bytes());
            b.extend_from_slice(&1u16.to_le_bytes());
            b.extend_from_slice(b"t");
            b.extend_from_slice(&[code, 1]);
            b.extend_from_slice(&8u64.to_le_bytes());
            b.extend_from_slice(&8u64.to_le_bytes());
            b.extend_from_slice(&[1, 2, 3, 4, 5, 6, 7, 8]);
            b
        };
        vec![
            ("u8.toy".to_string(), file(1)),
            ("bad-dtype.toy".to_string(), file(9)),
        ]
    }

    impl FormatWriter for ToyWriter {
        fn name(&self) -> &'static str {
            "toy"
        }
        fn extensions(&self) -> &'static [&'static str] {
            &["toy"]
        }
        /// Dense tensors from arrays; a conversion goes through the core's
        /// dense adapter (the trait's default `write`).
        fn caps(&self) -> WriterCaps {
            WriterCaps {
                metadata: MetadataCaps::None,
                options: &[],
                arrays: true,
            }
        }
        fn write_arrays(
            &self,
            tensors: &[TensorIn<'_>],
            _metadata: Option<&[(String, Value)]>,
            path: &Path,
            _options: &WriteOptions,
        ) -> Result<u64> {
            for t in tensors {
                t.check(&Context::file(path))?;
                if !DTYPES.contains(&t.dtype) {
                    return Err(Error::Write {
                        rule: Rule::WRITE_DTYPE,
                        ctx: Context::file(path).tensor(t.name),
                        reason: format!("toy files hold no {}", t.dtype),
                    });
                }
            }
            publish(path, |w| {
                w.write_all(MAGIC)?;
                w.write_all(&(tensors.len() as u32).to_le_bytes())?;
                for t in tensors {
                    w.write_all(&(t.name.len() as u16).to_le_bytes())?;
                    w.write_all(t.name.as_bytes())?;
                    let code = DTYPES.iter().position(|d| *d == t.dtype).unwrap_or(0);
                    w.write_all(&[code as u8, t.shape.len() as u8])?;
                    for d in t.shape {
                        w.write_all(&d.to_le_bytes())?;
                    }
                    w.write_all(&(t.data.len() as u64).to_le_bytes())?;
                    w.write_all(t.data)?;
                }
                Ok(())
            })
        }
    }

    use std::io::Write as _;
}

/// Step 2: one entry beside zt's own plugins.
fn registry() -> &'static Registry {
    static REGISTRY: OnceLock<Registry> = OnceLock::new();
    REGISTRY.get_or_init(|| {
        let mut plugins = vec![&toy::PLUGIN];
        plugins.extend_from_slice(zt::plugins());
        Registry::from_plugins(&plugins)
    })
}

fn f32s(values: &[f32]) -> Vec<u8> {
    values.iter().flat_map(|v| v.to_le_bytes()).collect()
}

fn save_toy(path: &Path) {
    let w = f32s(&[1.0, 2.0, 3.0, 4.0, 5.0, 6.0]);
    let ids: Vec<u8> = [7i64, -1].iter().flat_map(|v| v.to_le_bytes()).collect();
    let tensors = [
        TensorIn {
            name: "w",
            dtype: zt::DType::F32,
            shape: &[2, 3],
            data: &w,
        },
        TensorIn {
            name: "ids",
            dtype: zt::DType::I64,
            shape: &[2],
            data: &ids,
        },
    ];
    let writer = registry().writer_for(path).unwrap();
    let options = WriteOptions::default();
    zt::write::check_request(writer, path, &options, None).unwrap();
    writer.write_arrays(&tensors, None, path, &options).unwrap();
}

#[test]
fn a_format_added_by_its_plugin_entry_reads_writes_and_converts() {
    let dir = tempfile::tempdir().unwrap();
    let toy_path = dir.path().join("m.toy");
    save_toy(&toy_path);
    let options = zt::OpenOptions::default();
    assert_eq!(registry().detect(&toy_path, &options).unwrap(), "toy");
    let src = registry().open(&toy_path, &options).unwrap();
    assert_eq!(src.format(), "toy");
    let w = src.tensor("w").unwrap();
    assert_eq!(w.shape(), [2, 3]);
    let bytes = w.data().unwrap().bytes().unwrap();
    assert_eq!(&bytes[..], &f32s(&[1.0, 2.0, 3.0, 4.0, 5.0, 6.0])[..]);

    // To safetensors and back, through the registry's conversions.
    let st = dir.path().join("m.safetensors");
    registry()
        .convert(&src, &st, &WriteOptions::default())
        .unwrap();
    let back = dir.path().join("back.toy");
    let st_src = registry().open(&st, &options).unwrap();
    assert_eq!(st_src.format(), "safetensors");
    registry()
        .convert(&st_src, &back, &WriteOptions::default())
        .unwrap();
    let again = registry().open(&back, &options).unwrap();
    for name in ["w", "ids"] {
        let a = src.tensor(name).unwrap().data().unwrap().bytes().unwrap();
        let b = again.tensor(name).unwrap().data().unwrap().bytes().unwrap();
        assert_eq!(a, b, "{name}");
    }
    // Sharding is the format's layout to declare; the toy has none.
    assert!(registry()
        .convert_sharded(&src, &dir.path().join("s.toy"), 8, &WriteOptions::default())
        .is_err());
}

#[test]
fn the_registry_checks_requests_and_lists_rules_from_the_entry() {
    let dir = tempfile::tempdir().unwrap();
    let toy_path = dir.path().join("m.toy");
    save_toy(&toy_path);
    let src = registry()
        .open(&toy_path, &zt::OpenOptions::default())
        .unwrap();
    // Options the toy's caps do not list are refused before it runs.
    let aligned = WriteOptions::default().with_format(zt::ZtOptions {
        align: Some(zt::Align::Auto),
        ..zt::ZtOptions::default()
    });
    let err = registry()
        .convert(&src, &dir.path().join("x.toy"), &aligned)
        .unwrap_err();
    assert_eq!(err.rule().map(|r| r.name()), Some("write.Options"), "{err}");
    assert!(!dir.path().join("x.toy").exists());
    // Its rules are the registry's, and a refusal cites them.
    let names: Vec<&str> = registry().rules().map(|r| r.name()).collect();
    assert!(names.contains(&"toy.Header") && names.contains(&"toy.DType"));
    let mut bytes = std::fs::read(&toy_path).unwrap();
    bytes[4 + 4 + 2 + 1] = 9; // magic, count, name length, "w": the dtype code
    let bad = dir.path().join("bad.toy");
    std::fs::write(&bad, &bytes).unwrap();
    match registry().open(&bad, &zt::OpenOptions::default()) {
        Err(e @ Error::Header { .. }) => assert_eq!(e.rule().unwrap().name(), "toy.DType"),
        other => panic!("{other:?}"),
    }
    // Cut anywhere, it is a clean error, never a panic.
    for cut in 0..bytes.len() {
        let short = dir.path().join("short.toy");
        std::fs::write(&short, &std::fs::read(&toy_path).unwrap()[..cut]).unwrap();
        if let Ok(src) = registry().open(&short, &zt::OpenOptions::default()) {
            for t in src.tensors() {
                let _ = t.data().and_then(|p| p.bytes().map(|b| b.len()));
            }
        }
    }
    // Its checkpoint name joins the model directory search, in its place.
    assert_eq!(registry().checkpoint_names().last(), Some(&"model.toy"));
}

#[test]
fn its_fuzz_target_and_seeds_come_from_the_entry() {
    // The fuzz crate derives its targets from each plugin's
    // `fuzz_targets()`: the toy's is named `toy`, runs the toy reader and
    // is seeded from the directory its seed maker writes.
    let groups = toy::PLUGIN.fuzz_targets();
    assert_eq!(groups.len(), 1);
    let group = &groups[0];
    assert_eq!(group.target.name, "toy");
    let readers: Vec<&str> = group.readers.iter().map(|r| r.name()).collect();
    assert_eq!(readers, ["toy"]);
    assert_eq!(group.seed_dirs, ["fuzz/seeds/toy"]);
    // Its seeds are what the reader is fuzzed from: the valid one opens,
    // the other is refused citing the toy's rule.
    let dir = tempfile::tempdir().unwrap();
    let make = group.target.make_seeds.unwrap();
    for (name, bytes) in make() {
        let path = dir.path().join(&name);
        std::fs::write(&path, bytes).unwrap();
        let opened = registry().open(&path, &zt::OpenOptions::default());
        match name.as_str() {
            "u8.toy" => assert_eq!(opened.unwrap().tensor("t").unwrap().shape(), [8]),
            _ => assert_eq!(opened.unwrap_err().rule().unwrap().name(), "toy.DType"),
        }
    }
    // zt's own plugins declare theirs the same way.
    let names: Vec<&str> = zt::plugins()
        .iter()
        .flat_map(|p| p.fuzz_targets())
        .map(|g| g.target.name)
        .collect();
    assert!(names.contains(&"safetensors") && names.contains(&"numpy"));
}
