//! `PrivateMaps`: writable arrays that are views of private copy-on-write
//! mappings of the files (`zt_core::store::PrivateMaps`), what
//! `zt.numpy.load_file` and `safe_open.get_tensor` return by default, as
//! safetensors returns writable arrays. Each file is mapped again from the
//! descriptor zt opened and validated, once per `PrivateMaps`, and a whole
//! load populates that mapping (only the pages not cached), not zt's
//! shared one.

use std::sync::Arc;

use pyo3::prelude::*;

use crate::array::ArrayView;
use crate::tensor::Source;
use crate::to_py_err;

/// The private mappings one load (or one `safe_open` handle) views.
#[pyclass(frozen, module = "zt._zt")]
pub struct PrivateMaps {
    source: Arc<zt::Source>,
    maps: zt::store::PrivateMaps,
}

#[pymethods]
impl PrivateMaps {
    #[new]
    fn new(source: PyRef<'_, Source>) -> PyResult<Self> {
        Ok(PrivateMaps {
            source: source.inner()?,
            maps: zt::store::PrivateMaps::new(),
        })
    }

    /// A writable view of each tensor in `names`, or None for one whose
    /// bytes are not a raw range of a mapped local file (decoded, remote,
    /// several parts: the caller copies those), and for each whether its
    /// view is the array as numpy makes it (`Tensor._plain`: nothing to
    /// re-view on the Python side). Each tensor's lazy check (an npz
    /// member's CRC-32) runs first, failing as its reads do.
    /// `read_ahead`: read the tensors' bytes the cache lacks into the
    /// private mappings first, in file order (`Source::read_ahead_into`).
    #[pyo3(signature = (names, read_ahead = false))]
    fn arrays(
        &self,
        py: Python<'_>,
        names: Vec<String>,
        read_ahead: bool,
    ) -> PyResult<(Vec<Option<ArrayView>>, Vec<bool>)> {
        let source = &self.source;
        py.detach(|| {
            if read_ahead {
                let indexes: Vec<usize> = names.iter().filter_map(|n| source.position(n)).collect();
                source.read_ahead_into(&indexes, &self.maps)?;
            }
            let mut views = Vec::with_capacity(names.len());
            let mut plain = Vec::with_capacity(names.len());
            for name in &names {
                let tensor = source.tensor(name)?;
                let mut parts = tensor.parts();
                let (Some(part), None) = (parts.next(), parts.next()) else {
                    views.push(None);
                    plain.push(false);
                    continue;
                };
                let view = self
                    .maps
                    .view(&part)?
                    .and_then(|(map, address)| ArrayView::private(map, address, &part));
                plain.push(
                    view.is_some() && crate::array::numpy_as_is(tensor.layout(), part.dtype()),
                );
                views.push(view);
            }
            Ok((views, plain))
        })
        .map_err(to_py_err)
    }
}
