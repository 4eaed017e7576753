//! `Dir`: a temporary directory a test writes its files into, removed
//! when dropped. Shared by the per-format test files.

use std::path::PathBuf;

/// A temporary directory.
pub struct Dir(tempfile::TempDir);

impl Dir {
    /// A fresh, empty directory.
    pub fn new() -> Dir {
        Dir(tempfile::tempdir().unwrap())
    }

    /// Write `bytes` to the file `name` in it; its path.
    pub fn file(&self, name: &str, bytes: &[u8]) -> PathBuf {
        let path = self.path(name);
        std::fs::write(&path, bytes).unwrap();
        path
    }

    /// The path of `name` in it (written or not).
    pub fn path(&self, name: &str) -> PathBuf {
        self.0.path().join(name)
    }
}
