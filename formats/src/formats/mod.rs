//! One plugin per file. Register a new one in [`crate::format::registry`].

pub mod gguf;
pub mod h5;
pub mod npy;
pub mod onnx;
pub mod pt;
pub mod safetensors;
pub mod zt;
