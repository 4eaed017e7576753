//! The tables the Python package reads instead of keeping copies:
//! `zt._zt.DTYPES` (every zt dtype and how numpy holds it) and
//! `zt._zt.ZRECORD_LIMITS` (the zrecord store's codecs, layouts and
//! bounds). `zt/_tensor.py`, `_write.py`, `_zt_writer.py`, `_load.py` and
//! `zrecord.py` build their lookups from these at import.

use pyo3::prelude::*;
use pyo3::types::{PyDict, PyTuple};

use zt::dtype::DType;

/// The `ml_dtypes` type that holds a dtype numpy has no builtin for (one
/// element per byte for the 4-bit types, which are stored two per byte).
fn ml_dtypes_name(d: DType) -> Option<&'static str> {
    Some(match d {
        DType::BF16 => "bfloat16",
        DType::F8E4M3Fn => "float8_e4m3fn",
        DType::F8E5M2 => "float8_e5m2",
        DType::F8E4M3Fnuz => "float8_e4m3fnuz",
        DType::F8E5M2Fnuz => "float8_e5m2fnuz",
        DType::F8E8M0 => "float8_e8m0fnu",
        DType::F4E2M1 => "float4_e2m1fn",
        DType::I4 => "int4",
        DType::U4 => "uint4",
        _ => return None,
    })
}

/// `{name: {"bits", "storage", "typestr", "ml_dtypes", "zt"}}` for every
/// dtype: bits per element, the storage dtype's name, the numpy typestr of
/// the scalars the native side hands out (`ArrayView`: ML floats as
/// same-width unsigned integers, packed types as bytes), the `ml_dtypes`
/// type name or `None`, and whether zTensor registers it (a storage type,
/// or a logical type with a registered name; ONNX's int4/uint4 are not).
fn dtypes(py: Python<'_>) -> PyResult<Bound<'_, PyDict>> {
    let out = PyDict::new(py);
    for d in DType::ALL {
        let info = PyDict::new(py);
        info.set_item("bits", d.bits())?;
        info.set_item("storage", d.storage().name())?;
        info.set_item("typestr", crate::array::typestr(d))?;
        info.set_item("ml_dtypes", ml_dtypes_name(d))?;
        let zt_stores = !d.is_logical() || zt::container::validate::logical_name(d).is_some();
        info.set_item("zt", zt_stores)?;
        out.set_item(d.name(), info)?;
    }
    Ok(out)
}

/// The zrecord store's names and bounds, as the `zrecord` crate defines them.
fn zrecord_limits(py: Python<'_>) -> PyResult<Bound<'_, PyDict>> {
    use zrecord::{Codec, Layout};
    let out = PyDict::new(py);
    let codecs = [Codec::Raw, Codec::Zstd, Codec::ZstdDict].map(Codec::name);
    out.set_item("codecs", PyTuple::new(py, codecs)?)?;
    let layouts = [Layout::Loaderx28, Layout::Loaderx23].map(Layout::name);
    out.set_item("layouts", PyTuple::new(py, layouts)?)?;
    out.set_item("default_layout", Layout::default().name())?;
    out.set_item("max_data_shards", zrecord::layout::MAX_SHARDS)?;
    out.set_item("max_record_len", zrecord::layout::MAX_RECORD)?;
    Ok(out)
}

/// Every writer that writes from arrays, in the registry's order, as
/// `(name, extensions, caps)`: what `format=` may name, what an extension
/// picks, and what each accepts (`metadata`: "none", "strings" or "any";
/// `options`: the format options it takes; `shards`: whether it has a
/// sharded layout). Python reads these instead of keeping its own rules;
/// the writer's own checks (`zt::write::check_request`) are the same data.
fn array_writers(py: Python<'_>) -> PyResult<Bound<'_, PyTuple>> {
    let writers = zt::writers().iter().filter(|w| w.caps().arrays);
    let rows = writers
        .map(|w| {
            let caps = w.caps();
            let described = PyDict::new(py);
            described.set_item("metadata", caps.metadata.name())?;
            described.set_item("options", PyTuple::new(py, caps.options)?)?;
            described.set_item("shards", w.shard_layout().is_some())?;
            Ok((w.name(), PyTuple::new(py, w.extensions())?, described))
        })
        .collect::<PyResult<Vec<_>>>()?;
    PyTuple::new(py, rows)
}

/// Add the tables to the native module.
pub fn register(m: &Bound<'_, PyModule>) -> PyResult<()> {
    m.add("ARRAY_WRITERS", array_writers(m.py())?)?;
    m.add("DTYPES", dtypes(m.py())?)?;
    m.add("ZRECORD_LIMITS", zrecord_limits(m.py())?)?;
    Ok(())
}
