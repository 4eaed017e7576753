//! The rules ONNX refusals cite (`onnx.*`).

use zt_core::Rule;

/// The protobuf wire format is malformed.
pub const PROTOBUF: Rule = Rule::new("onnx.Protobuf");
/// A TensorProto is malformed (dimensions, field types).
pub const TENSOR: Rule = Rule::new("onnx.Tensor");
/// A tensor's data is not the size its shape and dtype need.
pub const SIZE: Rule = Rule::new("onnx.Size");
/// A sparse tensor is malformed (shape, index type, coordinates).
pub const SPARSE: Rule = Rule::new("onnx.Sparse");
/// External data references that are malformed or out of bounds.
pub const EXTERNAL: Rule = Rule::new("onnx.External");
/// An ONNX feature zt does not read (segmented tensors).
pub const UNSUPPORTED: Rule = Rule::new("onnx.Unsupported");

/// An external data location for an output that is not plain relative
/// names inside the output's directory (or the output itself).
pub const LOCATION: Rule = Rule::new("onnx.Location");
/// An output model past protobuf's 2 GB message limit.
pub const PROTOBUF_LIMIT: Rule = Rule::new("onnx.ProtobufLimit");
/// A rewrite (external data or inline) of a model or to an output in
/// object storage: both ends of a rewrite are local files.
pub const REMOTE: Rule = Rule::new("onnx.Remote");
/// External data to a safetensors file whose tensors it cannot name (an
/// unnamed or repeated initializer name).
pub const SAFETENSORS: Rule = Rule::new("onnx.Safetensors");

/// Every `onnx.*` rule: the registry's tests check that names are unique
/// across plugins and carry the prefix.
pub const RULES: &[Rule] = &[
    PROTOBUF,
    TENSOR,
    SIZE,
    SPARSE,
    EXTERNAL,
    UNSUPPORTED,
    LOCATION,
    PROTOBUF_LIMIT,
    REMOTE,
    SAFETENSORS,
];
