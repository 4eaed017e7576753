//! The one list of plugins. The CLI, the Python binding and the Rust API all
//! read it through [`registry`]; nothing else names a format. Each plugin
//! describes itself in its own directory (`formats/src/NAME/`, its
//! `PLUGIN`: readers with their detection rank, writers, rules, checkpoint
//! names); this list is the only other place a format is named.

use std::sync::OnceLock;

use zt_core::{Plugin, Registry, Rule};
use zt_formats::{dcp, gguf, h5, npy, onnx, pt, safetensors, tensordict, zarr, zip, ztensor};

/// Every plugin. Detection order comes from each reader's rank, not from
/// this order (which only breaks ties and orders the writers).
static PLUGINS: &[&Plugin] = &[
    &ztensor::PLUGIN,
    &gguf::PLUGIN,
    &h5::PLUGIN,
    &npy::PLUGIN,
    &pt::PLUGIN,
    &safetensors::PLUGIN,
    &onnx::PLUGIN,
    &zip::PLUGIN,
    &dcp::PLUGIN,
    &tensordict::PLUGIN,
    &zarr::PLUGIN,
];

/// Every plugin zt links, as listed.
pub fn plugins() -> &'static [&'static Plugin] {
    PLUGINS
}

/// Every format zt reads and writes.
pub fn registry() -> &'static Registry {
    static REGISTRY: OnceLock<Registry> = OnceLock::new();
    REGISTRY.get_or_init(|| Registry::from_plugins(PLUGINS))
}

/// Every rule a refusal can cite: the core's ([`Rule::CORE`]), then each
/// plugin's.
pub fn rules() -> impl Iterator<Item = Rule> {
    registry().rules()
}

#[cfg(test)]
mod tests {
    use super::{registry, rules, PLUGINS};
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
        let sets: Vec<_> = PLUGINS.iter().flat_map(|p| p.rules).collect();
        for (prefix, list) in &sets {
            assert!(!list.is_empty(), "{prefix} lists no rule");
            for rule in *list {
                assert_eq!(rule.plugin(), *prefix, "{rule} is listed under {prefix}");
            }
        }
        // Each plugin's prefix is listed once, and none is a core group.
        let prefixes: HashSet<_> = sets.iter().map(|(p, _)| *p).collect();
        assert_eq!(prefixes.len(), sets.len());
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

    #[test]
    fn detection_order_and_checkpoint_names_come_from_the_plugins() {
        // The order detection relies on: magic numbers first (TensorDict's
        // `.tdz` zip, its meta.json text and consolidated trailer among
        // them), PyTorch's zips before npz, safetensors' structure, ONNX
        // last.
        let order: Vec<&str> = registry().formats().iter().map(|f| f.name()).collect();
        assert_eq!(
            order,
            [
                "zt",
                "gguf",
                "tensordict-tdz",
                "tensordict",
                "tensordict-consolidated",
                "zarr",
                "keras",
                "h5",
                "npy",
                "dcp",
                "pt",
                "npz",
                "safetensors",
                "onnx"
            ]
        );
        let writers: Vec<&str> = registry().writers().iter().map(|w| w.name()).collect();
        assert_eq!(
            writers,
            [
                "zt",
                "gguf",
                "h5",
                "npz",
                "npy",
                "pt",
                "safetensors",
                "dcp",
                "tensordict",
                "tensordict-consolidated"
            ]
        );
        assert_eq!(
            registry().checkpoint_names(),
            [
                "model.safetensors.index.json",
                "model.safetensors",
                "pytorch_model.bin.index.json",
                "pytorch_model.bin",
                "model.zt",
                ".metadata",
                "meta.json",
                "zarr.json",
                ".zmetadata",
                ".zgroup",
                ".zarray",
            ]
        );
        let names: HashSet<&str> = PLUGINS.iter().map(|p| p.name).collect();
        assert_eq!(names.len(), PLUGINS.len(), "a plugin listed twice");
    }
}
