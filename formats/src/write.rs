//! Shared pieces of every writer: the tensor a writer is handed, and
//! `publish`, which builds a file beside its destination and renames it into
//! place so that an error or a crash never leaves a partial file there.

use std::borrow::Cow;
use std::fs::File;
use std::io::BufWriter;
use std::path::{Path, PathBuf};

use crate::dtype::{num_elements, DType};
use crate::error::{Context, Error, Result};
use crate::source::Source;

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

/// The hidden sibling of `path` that this process builds it in before the
/// rename (`.NAME.PID.partial`, same directory, so the rename is atomic).
/// Every writer uses it, so a progress display can watch it grow.
pub fn partial_path(path: &Path) -> Result<PathBuf> {
    let dir = match path.parent() {
        Some(p) if !p.as_os_str().is_empty() => p.to_path_buf(),
        _ => PathBuf::from("."),
    };
    let file_name = path.file_name().ok_or_else(|| Error::Write {
        ctx: Context::file(path),
        reason: "destination has no file name".into(),
    })?;
    Ok(dir.join(format!(
        ".{}.{}.partial",
        file_name.to_string_lossy(),
        std::process::id()
    )))
}

/// Write a file through `body` into a hidden sibling of `path`, then rename
/// it over `path`. Returns the bytes written. On any error the sibling is
/// removed and `path` is left as it was.
pub fn publish(
    path: &Path,
    body: impl FnOnce(&mut BufWriter<File>) -> std::io::Result<()>,
) -> Result<u64> {
    let tmp = partial_path(path)?;
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

/// Where a `.zt` writer places blobs (other writers ignore it).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Align {
    /// Canonical zTensor placement (64 KiB, byte-reproducible output).
    Canonical,
    /// Large tensors at 64 KiB, small ones at the 4 KiB floor.
    Auto,
    /// Every blob at a multiple of this power of two (at least 4096).
    Bytes(u64),
}

/// Options a writer receives. A writer refuses options it cannot honour
/// rather than ignoring them silently.
#[derive(Debug, Clone, Default)]
pub struct WriteOptions {
    /// Blob placement (`.zt`); `None` is the writer's default.
    pub align: Option<Align>,
    /// zstd compression level for writers that compress; `None` is raw.
    pub compression: Option<i32>,
}

/// A format zt can write: the mirror image of [`crate::Format`].
pub trait FormatWriter: Send + Sync + 'static {
    /// Format name (`"safetensors"`).
    fn name(&self) -> &'static str;
    /// Extensions that select this writer, lowercase, without the dot.
    fn extensions(&self) -> &'static [&'static str];
    /// Write every tensor of `source` to `path` (built beside it and renamed
    /// into place). Returns the bytes written.
    fn write(&self, source: &Source, path: &Path, options: &WriteOptions) -> Result<u64>;
}

/// Every format zt can write.
pub fn writers() -> &'static [&'static dyn FormatWriter] {
    &[
        &crate::formats::safetensors::SafetensorsWriter,
        &crate::formats::npy::NpzWriter,
        &crate::formats::npy::NpyWriter,
        &crate::formats::pt::PtWriter,
        &crate::formats::gguf::GgufWriter,
        &crate::formats::zt::ZtWriter,
    ]
}

/// The writer whose extension `path` has.
pub fn writer_for(path: &Path) -> Result<&'static dyn FormatWriter> {
    let ext = path
        .extension()
        .and_then(|e| e.to_str())
        .map(str::to_ascii_lowercase)
        .unwrap_or_default();
    writers()
        .iter()
        .copied()
        .find(|w| w.extensions().contains(&ext.as_str()))
        .ok_or_else(|| {
            let known: Vec<&str> = writers()
                .iter()
                .flat_map(|w| w.extensions().iter().copied())
                .collect();
            Error::Write {
                ctx: Context::file(path),
                reason: format!(
                    "no writer for extension {ext:?} (zt writes {})",
                    known.join(", ")
                ),
            }
        })
}

/// Write every tensor of `source` to `path`, in the format its extension names.
pub fn convert(source: &Source, path: &Path, options: &WriteOptions) -> Result<u64> {
    writer_for(path)?.write(source, path, options)
}

/// A dense tensor of a source, its bytes borrowed from the mapping when
/// they are raw there and decoded otherwise.
#[derive(Debug)]
pub struct DenseTensor<'a> {
    /// Name.
    pub name: &'a str,
    /// Element type.
    pub dtype: DType,
    /// Shape.
    pub shape: &'a [u64],
    /// C-order bytes.
    pub data: Cow<'a, [u8]>,
}

impl DenseTensor<'_> {
    /// The tensor as a writer input.
    pub fn input(&self) -> TensorIn<'_> {
        TensorIn {
            name: self.name,
            dtype: self.dtype,
            shape: self.shape,
            data: &self.data,
        }
    }
}

/// Every tensor of `source`, for writers of formats that hold only dense
/// tensors. Mapped tensors are borrowed, not copied; a tensor of another
/// layout is an error naming it.
pub fn dense_tensors<'a>(source: &'a Source, path: &Path) -> Result<Vec<DenseTensor<'a>>> {
    source
        .tensors()
        .map(|t| {
            if t.layout() != "dense" {
                return Err(Error::Write {
                    ctx: Context::file(path).tensor(t.name()),
                    reason: format!("layout {} has no equivalent in this format", t.layout()),
                });
            }
            let part = t.data()?;
            Ok(DenseTensor {
                name: t.name(),
                dtype: part.dtype(),
                shape: part.shape(),
                data: part.bytes()?,
            })
        })
        .collect()
}

/// Refuse options that a format without alignment or compression cannot honour.
pub fn refuse_zt_options(name: &str, path: &Path, options: &WriteOptions) -> Result<()> {
    if options.align.is_some() || options.compression.is_some() {
        return Err(Error::Write {
            ctx: Context::file(path),
            reason: format!("{name} files have no alignment or compression options"),
        });
    }
    Ok(())
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
