//! One plugin per file. Register a new one in [`crate::format::registry`].

pub mod detect_only;
pub mod npy;
pub mod safetensors;
pub mod zt;
