//! Shared pieces of every writer: the tensor a writer is handed, and
//! `publish`, which builds a file beside its destination and renames it into
//! place so that an error or a crash never leaves a partial file there.

use std::fs::File;
use std::io::BufWriter;
use std::path::{Path, PathBuf};

use crate::dtype::{num_elements, DType};
use crate::error::{Context, Error, Result};

/// A tensor handed to a writer: C-order little-endian bytes.
#[derive(Debug, Clone, Copy)]
pub struct TensorIn<'a> {
    /// Name.
    pub name: &'a str,
    /// Element type.
    pub dtype: DType,
    /// Shape (rank 0 allowed).
    pub shape: &'a [u64],
    /// The elements, C order, little-endian.
    pub data: &'a [u8],
}

impl TensorIn<'_> {
    /// Check that the data length matches shape and dtype.
    pub fn check(&self, ctx: &Context) -> Result<()> {
        let ctx = ctx.clone().tensor(self.name);
        let need = num_elements(self.shape)
            .and_then(|n| self.dtype.nbytes(n))
            .ok_or(Error::Overflow {
                ctx: ctx.clone(),
                what: "byte size",
            })?;
        if need != self.data.len() as u64 {
            return Err(Error::Write {
                ctx,
                reason: format!(
                    "shape {:?} of {} needs {need} bytes, {} given",
                    self.shape,
                    self.dtype,
                    self.data.len()
                ),
            });
        }
        Ok(())
    }
}

/// A temporary file beside the destination that is removed unless
/// `commit` renames it into place.
struct Partial {
    tmp: PathBuf,
    dest: PathBuf,
    done: bool,
}

impl Drop for Partial {
    fn drop(&mut self) {
        if !self.done {
            let _ = std::fs::remove_file(&self.tmp);
        }
    }
}

/// Write a file through `body` into a hidden sibling of `path`, then rename
/// it over `path`. Returns the bytes written. On any error the sibling is
/// removed and `path` is left as it was.
pub fn publish(
    path: &Path,
    body: impl FnOnce(&mut BufWriter<File>) -> std::io::Result<()>,
) -> Result<u64> {
    let dir = match path.parent() {
        Some(p) if !p.as_os_str().is_empty() => p.to_path_buf(),
        _ => PathBuf::from("."),
    };
    let file_name = path.file_name().ok_or_else(|| Error::Write {
        ctx: Context::file(path),
        reason: "destination has no file name".into(),
    })?;
    let tmp = dir.join(format!(
        ".{}.{}.partial",
        file_name.to_string_lossy(),
        std::process::id()
    ));
    let mut partial = Partial {
        tmp: tmp.clone(),
        dest: path.to_path_buf(),
        done: false,
    };
    let file = File::create(&tmp).map_err(|e| Error::io(&tmp, e))?;
    let mut w = BufWriter::with_capacity(1 << 20, file);
    body(&mut w).map_err(|e| Error::io(path, e))?;
    let file = w
        .into_inner()
        .map_err(|e| Error::io(path, e.into_error()))?;
    let written = file.metadata().map_err(|e| Error::io(&tmp, e))?.len();
    drop(file);
    std::fs::rename(&partial.tmp, &partial.dest).map_err(|e| Error::io(path, e))?;
    partial.done = true;
    Ok(written)
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::io::Write;

    #[test]
    fn failed_body_leaves_nothing() {
        let dir = tempfile::tempdir().unwrap();
        let dest = dir.path().join("x.bin");
        let err = publish(&dest, |w| {
            w.write_all(b"half")?;
            Err(std::io::Error::other("boom"))
        });
        assert!(err.is_err());
        assert_eq!(std::fs::read_dir(dir.path()).unwrap().count(), 0);
    }

    #[test]
    fn success_replaces_destination() {
        let dir = tempfile::tempdir().unwrap();
        let dest = dir.path().join("x.bin");
        std::fs::write(&dest, b"old").unwrap();
        assert_eq!(publish(&dest, |w| w.write_all(b"new!")).unwrap(), 4);
        assert_eq!(std::fs::read(&dest).unwrap(), b"new!");
        assert_eq!(std::fs::read_dir(dir.path()).unwrap().count(), 1);
    }
}
