//! The one list of plugins. The CLI, the Python binding and the Rust API all
//! read it through [`registry`]; nothing else names a format. The plugins'
//! rule lists are here too ([`rules`]), so a test sees every rule at once.

use zt_core::{Format, FormatWriter, Registry, Rule};
use zt_formats::{gguf, h5, npy, onnx, pt, safetensors, zip, ztensor};

/// Readers in detection order: formats with magic numbers first (PyTorch
/// zips before npz, since both are zips), then safetensors (a length prefix
/// and a JSON object), then the protobuf-shaped ONNX, which has no magic.
static FORMATS: &[&dyn Format] = &[
    &ztensor::Zt,
    &gguf::Gguf,
    &h5::Hdf5,
    &npy::Npy,
    &pt::Pt,
    &npy::Npz,
    &safetensors::Safetensors,
    &onnx::Onnx,
];

/// Writers; a destination's extension picks one.
static WRITERS: &[&dyn FormatWriter] = &[
    &safetensors::SafetensorsWriter,
    &npy::NpzWriter,
    &npy::NpyWriter,
    &pt::PtWriter,
    &gguf::GgufWriter,
    &ztensor::ZtWriter,
];

/// Each plugin's rules (its module's `RULES`), by the prefix their names
/// carry. `zip` is the archive reader PyTorch and npz share.
static PLUGIN_RULES: &[(&str, &[Rule])] = &[
    ("zt", ztensor::RULES),
    ("gguf", gguf::RULES),
    ("h5", h5::RULES),
    ("npy", npy::RULES),
    ("npz", npy::NPZ_RULES),
    ("zip", zip::RULES),
    ("pt", pt::RULES),
    ("safetensors", safetensors::RULES),
    ("onnx", onnx::RULES),
];

static REGISTRY: Registry = Registry::new(FORMATS, WRITERS);

/// Every format zt reads and writes.
pub fn registry() -> &'static Registry {
    &REGISTRY
}

/// Every rule a refusal can cite: the core's ([`Rule::CORE`]), then each
/// plugin's.
pub fn rules() -> impl Iterator<Item = Rule> {
    Rule::CORE
        .iter()
        .chain(PLUGIN_RULES.iter().flat_map(|(_, rules)| rules.iter()))
        .copied()
}

#[cfg(test)]
mod tests {
    use super::{rules, PLUGIN_RULES};
    use std::collections::HashSet;
    use zt_core::Rule;

    #[test]
    fn rule_names_are_unique_across_plugins_and_carry_their_prefix() {
        let mut seen = HashSet::new();
        for rule in rules() {
            assert!(seen.insert(rule.name()), "{rule} named twice");
            let (plugin, check) = rule.name().split_once('.').expect("no plugin prefix");
            assert!(!check.is_empty() && !check.contains('.'), "{rule}");
            assert_eq!(rule.plugin(), plugin);
            assert_eq!(rule.to_string(), rule.name());
        }
        for &rule in Rule::CORE {
            assert!(
                ["core", "index", "access", "write"].contains(&rule.plugin()),
                "{rule}"
            );
        }
        for (prefix, list) in PLUGIN_RULES {
            assert!(!list.is_empty(), "{prefix} lists no rule");
            for rule in *list {
                assert_eq!(rule.plugin(), *prefix, "{rule} is listed under {prefix}");
            }
        }
        // Each plugin's prefix is listed once, and none is a core group.
        let prefixes: HashSet<_> = PLUGIN_RULES.iter().map(|(p, _)| *p).collect();
        assert_eq!(prefixes.len(), PLUGIN_RULES.len());
        assert!(!prefixes
            .iter()
            .any(|p| ["core", "index", "access", "write"].contains(p)));
        // The names tests, sidecars and Python see (spot checks).
        for name in [
            "zt.BlobOverlap",
            "safetensors.Offsets",
            "npz.Crc",
            "zip.Directory",
            "core.Truncated",
        ] {
            assert!(seen.contains(name), "{name} missing");
        }
        assert_eq!(seen.len(), rules().count());
    }
}
