//! One plugin per file. Register a new one in [`crate::format::registry`].

pub mod detect_only;
pub mod h5;
pub mod npy;
pub mod safetensors;
