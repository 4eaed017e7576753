//! NumPy `.npy` and `.npz` (being written).

use crate::catalog::Catalog;
use crate::error::{Error, Result};
use crate::format::{Format, OpenInput, Probe};

/// `.npy`.
pub struct Npy;
/// `.npz`.
pub struct Npz;

impl Format for Npy {
    fn name(&self) -> &'static str {
        "npy"
    }
    fn extensions(&self) -> &'static [&'static str] {
        &["npy"]
    }
    fn sniff(&self, p: &Probe<'_>) -> bool {
        p.head.starts_with(b"\x93NUMPY")
    }
    fn open(&self, input: &OpenInput<'_>) -> Result<Catalog> {
        Err(Error::Unreadable {
            ctx: input.ctx(),
            format: "npy",
        })
    }
}
impl Format for Npz {
    fn name(&self) -> &'static str {
        "npz"
    }
    fn extensions(&self) -> &'static [&'static str] {
        &["npz"]
    }
    fn sniff(&self, p: &Probe<'_>) -> bool {
        p.head.starts_with(b"PK\x03\x04") && p.extension == "npz"
    }
    fn open(&self, input: &OpenInput<'_>) -> Result<Catalog> {
        Err(Error::Unreadable {
            ctx: input.ctx(),
            format: "npz",
        })
    }
}
