//! Where a store lives. A location is a `Path`: a local file, or an
//! object-storage URL (`s3://bucket/key`, `gs://bucket/key`,
//! `az://container/key`, `https://host/path`) carried as
//! the path's text, so every context, listing and error names it the same
//! way whichever backing serves it.

use std::path::{Component, Path, PathBuf};

/// URL schemes zt reads through object storage (zt-remote's list).
pub const URL_SCHEMES: &[&str] = zt_remote::URL_SCHEMES;

/// True if `location` is an object-storage URL rather than a local path.
pub fn is_url(location: &Path) -> bool {
    location
        .to_str()
        .is_some_and(|s| URL_SCHEMES.iter().any(|scheme| s.starts_with(scheme)))
}

/// The directory of a local path, as a path that can be joined (`.` for a
/// bare file name).
pub fn parent_dir(path: &Path) -> PathBuf {
    match path.parent() {
        Some(p) if !p.as_os_str().is_empty() => p.to_path_buf(),
        _ => PathBuf::from("."),
    }
}

/// The location of `name` (a relative path of plain components) beside
/// `base`: in the same directory, or under the same key prefix.
pub fn sibling(base: &Path, name: &str) -> PathBuf {
    let rel: Vec<String> = Path::new(name)
        .components()
        .filter_map(|c| match c {
            Component::Normal(s) => Some(s.to_string_lossy().into_owned()),
            _ => None,
        })
        .collect();
    if is_url(base) {
        let text = base.to_string_lossy();
        let prefix = match text.rfind('/') {
            Some(i) if i > text.find("://").map_or(0, |s| s + 2) => &text[..=i],
            _ => text.as_ref(),
        };
        let sep = if prefix.ends_with('/') { "" } else { "/" };
        PathBuf::from(format!("{prefix}{sep}{}", rel.join("/")))
    } else {
        let mut out = parent_dir(base);
        out.extend(rel);
        out
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn urls_and_paths() {
        assert!(is_url(Path::new("s3://b/k.safetensors")));
        assert!(is_url(Path::new("https://h/a/b")));
        for url in [
            "gs://b/k",
            "gcs://b/k",
            "az://c/k",
            "abfs://c/k",
            "abfss://c/k",
        ] {
            assert!(is_url(Path::new(url)), "{url}");
        }
        assert!(!is_url(Path::new("s3:/b/k")));
        assert!(!is_url(Path::new("./s3://b")));
        assert!(!is_url(Path::new("/data/model.pt")));
    }

    #[test]
    fn siblings() {
        let url = |s: &str| PathBuf::from(s);
        assert_eq!(
            sibling(Path::new("s3://b/dir/m.onnx"), "w.bin"),
            url("s3://b/dir/w.bin")
        );
        assert_eq!(
            sibling(Path::new("s3://b/m.onnx"), "./sub/w.bin"),
            url("s3://b/sub/w.bin")
        );
        assert_eq!(
            sibling(Path::new("https://h/a/m.zt"), "m-1.zt"),
            url("https://h/a/m-1.zt")
        );
        assert_eq!(
            sibling(
                Path::new("gs://b/dir/model.safetensors.index.json"),
                "m-1.safetensors"
            ),
            url("gs://b/dir/m-1.safetensors")
        );
        assert_eq!(
            sibling(Path::new("az://c/m.onnx"), "w.bin"),
            url("az://c/w.bin")
        );
        assert_eq!(sibling(Path::new("m.onnx"), "w.bin"), url("./w.bin"));
        assert_eq!(sibling(Path::new("/d/m.onnx"), "w.bin"), url("/d/w.bin"));
    }
}
