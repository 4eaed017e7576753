//! The one list of plugins. The CLI, the Python binding and the Rust API all
//! read it through [`registry`]; nothing else names a format.

use zt_core::{Format, FormatWriter, Registry};
use zt_formats::{gguf, h5, npy, onnx, pt, safetensors, ztensor};

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

static REGISTRY: Registry = Registry::new(FORMATS, WRITERS);

/// Every format zt reads and writes.
pub fn registry() -> &'static Registry {
    &REGISTRY
}
