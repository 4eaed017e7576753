//! `zt.open(..., dequantize=True)`: a source's quantized safetensors
//! schemes as the tensors the unquantized model has
//! (`zt::formats::quant::dequantize`), a new native `Source` over the same
//! files.

use pyo3::prelude::*;

use crate::tensor::Source;
use crate::to_py_err;

/// The dequantized view of `source`: `dtype` the dequantized tensors'
/// (`None`: f32) and every other floating tensor's, `config` the model's configuration as JSON text (`None`:
/// the `config.json` beside the source's first file, if any).
#[pyfunction]
#[pyo3(signature = (source, dtype = None, config = None))]
pub fn dequantize(
    py: Python<'_>,
    source: &Source,
    dtype: Option<String>,
    config: Option<String>,
) -> PyResult<Source> {
    let inner = source.inner()?;
    let dtype = dtype
        .as_deref()
        .map(zt::transform::parse_cast_dtype)
        .transpose()
        .map_err(to_py_err)?;
    let config = config
        .as_deref()
        .map(|text| zt::formats::quant::config::parse(&Default::default(), text.as_bytes()))
        .transpose()
        .map_err(to_py_err)?;
    let options = zt::formats::quant::Options { dtype, config };
    // With a dtype, the tensors that were not quantized are cast as
    // `convert(dtype=)` casts them (the dequantized ones already are).
    let cast = zt::Transform {
        dtype,
        ..Default::default()
    };
    let out = py
        .detach(|| {
            let out = zt::formats::quant::dequantize(&inner, &options)?;
            match dtype {
                Some(_) => out.transform(&cast),
                None => Ok(out),
            }
        })
        .map_err(to_py_err)?;
    Ok(Source::new(out))
}

/// `convert(..., layout="mlx")`: every GGUF Q4_1 tensor of `source` as
/// MLX's affine `X.weight`, `X.scales`, `X.biases` (4 bits, group 32),
/// moved without going through floats
/// (`zt::formats::quant::mlx::repack::from_q4_1`).
#[pyfunction]
pub fn repack_mlx(py: Python<'_>, source: &Source) -> PyResult<Source> {
    let inner = source.inner()?;
    let out = py
        .detach(|| zt::formats::quant::mlx::repack::from_q4_1(&inner))
        .map_err(to_py_err)?;
    Ok(Source::new(out))
}

/// `convert(mlx_weights, "x.gguf", quantization_config=...)` without
/// `dequantize`: `source`'s MLX affine 4-bit group-32 weights as Q4_1
/// objects, moved without going through floats, the configuration given
/// as JSON text (`config.json`'s, or MLX's `quantization` alone) instead of
/// read from beside the file (`zt::formats::quant::mlx::repack::to_q4_1_with`).
/// `None` when the configuration declares no MLX quantization or the
/// source has no such weights.
#[pyfunction]
pub fn repack_q4_1(py: Python<'_>, source: &Source, config: &str) -> PyResult<Option<Source>> {
    let inner = source.inner()?;
    let config = zt::formats::quant::config::parse(&Default::default(), config.as_bytes())
        .map_err(to_py_err)?;
    let out = py
        .detach(|| zt::formats::quant::mlx::repack::to_q4_1_with(&inner, &config))
        .map_err(to_py_err)?;
    Ok(out.map(Source::new))
}
