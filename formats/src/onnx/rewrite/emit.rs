//! Writing a planned rewrite: literals through a small buffer, everything
//! read from a file (unchanged runs of the model, tensor bytes) copied by
//! the kernel from a descriptor on that file (`copy_file_range`, which
//! `std::io::copy` uses between files), so neither the model nor a tensor
//! passes through this process's memory and resident memory stays at the
//! buffer's size whatever the model's.

use std::collections::HashMap;
use std::fs::File;
use std::io::{Read, Seek, SeekFrom, Write};
use std::os::unix::fs::FileExt;
use std::path::Path;
use std::sync::Arc;

use super::plan::{put_varint, tag, Body, Data, Moved, Span};
use zt_core::error::{Error, Result};
use zt_core::store::Store;

/// Copies shorter than this are read into the buffer (a kernel copy per
/// small run would cost a system call each).
const SMALL: u64 = 256 << 10;
/// The buffer, and the pieces a store without a descriptor is read in.
const BUF: usize = 1 << 20;

/// An output file written front to back.
pub struct Sink<'f> {
    file: &'f File,
    /// Where errors are reported: the destination's name.
    dest: &'f Path,
    buf: Vec<u8>,
    written: u64,
    /// Descriptors on the stores copied from, by store.
    files: HashMap<*const Store, File>,
}

impl<'f> Sink<'f> {
    /// Write into `file` (fresh, at offset 0), reported as `dest`.
    pub fn new(file: &'f File, dest: &'f Path) -> Self {
        Sink {
            file,
            dest,
            buf: Vec::with_capacity(BUF),
            written: 0,
            files: HashMap::new(),
        }
    }

    fn io(&self, e: std::io::Error) -> Error {
        Error::io(self.dest, e)
    }

    fn flush(&mut self) -> Result<()> {
        if !self.buf.is_empty() {
            let mut out = self.file;
            out.write_all(&self.buf).map_err(|e| self.io(e))?;
            self.buf.clear();
        }
        Ok(())
    }

    /// Append `bytes`.
    pub fn lit(&mut self, bytes: &[u8]) -> Result<()> {
        if self.buf.len() + bytes.len() > BUF {
            self.flush()?;
        }
        if bytes.len() > BUF {
            let mut out = self.file;
            out.write_all(bytes).map_err(|e| self.io(e))?;
        } else {
            self.buf.extend_from_slice(bytes);
        }
        self.written += bytes.len() as u64;
        Ok(())
    }

    /// Append `n` zero bytes (alignment padding, under a page).
    pub fn zeros(&mut self, n: u64) -> Result<()> {
        self.lit(&vec![0; n as usize])
    }

    /// A descriptor on `store`'s file (the very file it maps), opened once.
    /// It may share its file offset with the store's own descriptor (a
    /// dup): [`Sink::copy`] seeks it before each copy, and every other
    /// reader of a store reads by position, never by that offset.
    fn descriptor(&mut self, store: &Arc<Store>) -> Option<&File> {
        let key = Arc::as_ptr(store);
        if let std::collections::hash_map::Entry::Vacant(slot) = self.files.entry(key) {
            slot.insert(store.reopen()?);
        }
        self.files.get(&key)
    }

    /// Append `len` bytes of `store` from `offset`.
    pub fn copy(&mut self, store: &Arc<Store>, offset: u64, len: u64) -> Result<()> {
        store.check_range(offset, len, "byte range")?;
        let in_store = |e: std::io::Error| Error::io(store.path(), e);
        if len < SMALL {
            if self.buf.len() as u64 + len > BUF as u64 {
                self.flush()?;
            }
            let mut buf = std::mem::take(&mut self.buf);
            let at = buf.len();
            buf.resize(at + len as usize, 0);
            let read = match self.descriptor(store) {
                Some(file) => file.read_exact_at(&mut buf[at..], offset).map_err(in_store),
                None => store.read_into(offset, &mut buf[at..]),
            };
            self.buf = buf;
            read?;
            self.written += len;
            return Ok(());
        }
        self.flush()?;
        let (file, dest) = (self.file, self.dest);
        match self.descriptor(store) {
            Some(mut src) => {
                src.seek(SeekFrom::Start(offset)).map_err(in_store)?;
                let mut out = file;
                let copied =
                    std::io::copy(&mut src.take(len), &mut out).map_err(|e| Error::io(dest, e))?;
                if copied != len {
                    return Err(in_store(std::io::Error::new(
                        std::io::ErrorKind::UnexpectedEof,
                        format!("the file ended {} bytes early", len - copied),
                    )));
                }
                self.written += len;
            }
            None => {
                let mut piece = vec![0u8; BUF];
                let mut done = 0;
                while done < len {
                    let n = (len - done).min(BUF as u64) as usize;
                    store.read_into(offset + done, &mut piece[..n])?;
                    let mut out = file;
                    out.write_all(&piece[..n]).map_err(|e| Error::io(dest, e))?;
                    done += n as u64;
                }
                self.written += len;
            }
        }
        Ok(())
    }

    /// Append a planned body, reading unchanged runs from `model`.
    pub fn body(&mut self, model: &Arc<Store>, body: &Body) -> Result<()> {
        for span in &body.spans {
            match span {
                Span::Copy { offset, len } => self.copy(model, *offset, *len)?,
                Span::Lit(bytes) => self.lit(bytes)?,
                Span::Msg { field, body } => {
                    let mut head = tag(*field, 2);
                    put_varint(&mut head, body.len);
                    self.lit(&head)?;
                    self.body(model, body)?;
                }
                Span::Data(Data { store, offset, len }) => self.copy(store, *offset, *len)?,
            }
        }
        Ok(())
    }

    /// Append the data file's tensors at their planned offsets.
    pub fn data_file(&mut self, moved: &[Moved]) -> Result<()> {
        for m in moved {
            self.zeros(m.at - self.written)?;
            self.copy(&m.data.store, m.data.offset, m.data.len)?;
        }
        Ok(())
    }

    /// Write out what is buffered.
    pub fn finish(mut self) -> Result<u64> {
        self.flush()?;
        Ok(self.written)
    }
}
