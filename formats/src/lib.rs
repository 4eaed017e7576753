//! # zt-formats: one plugin per tensor file format
//!
//! Each module implements [`zt_core::Format`] (and, where zt writes the
//! format, [`zt_core::FormatWriter`]) against the core only. The `zt`
//! crate's `registry()` is the one list that names them; adding a format is
//! a module here and a line there. Each module declares the rules its
//! refusals cite (`NAME::rules`, listed in `NAME::RULES`); the core names
//! none of them.

pub mod dcp;
pub mod gguf;
pub mod h5;
pub mod npy;
pub mod onnx;
pub mod pt;
pub mod quant;
pub mod safetensors;
pub mod tensordict;
pub mod zarr;
pub mod zip;
pub mod ztensor;
