//! Which records train a store's zstd dictionary: the selection that makes
//! zt's dictionaries byte-identical to loaderx's (the same records, in the
//! same order, handed to the same zstd trainer), for Rust and Python alike.
//!
//! loaderx takes `k = min(n, max(1, budget / item_bytes))` records evenly
//! spread over the store, `numpy.unique(numpy.linspace(0, n - 1, k)
//! .astype(int))`, where `item_bytes` is a Dense store's row and a Ragged
//! store's mean payload over its first 32 records (truncated). The float
//! arithmetic below is numpy's, step for step, so every index agrees.

use crate::codec::{train_dict, DictTier};
use crate::error::{Error, Result};
use crate::reader::Reader;
use crate::schema::Geometry;

/// How many records of `item_bytes` fit the sample `budget`: at least one,
/// at most `total`.
pub fn sample_count(total: u64, item_bytes: u64, budget: u64) -> u64 {
    total.min((budget / item_bytes.max(1)).max(1))
}

/// `numpy.unique(numpy.linspace(0, total - 1, count).astype(int))`: `count`
/// indices evenly spread over `[0, total)`, truncated, deduplicated, in
/// increasing order.
pub fn spread_indices(total: u64, count: u64) -> Vec<u64> {
    if total == 0 || count == 0 {
        return Vec::new();
    }
    let stop = (total - 1) as f64;
    let mut out: Vec<u64> = Vec::with_capacity(count as usize);
    // numpy: step = (stop - start) / (num - 1); y = arange(num) * step +
    // start; y[-1] = stop (for num > 1).
    let step = if count > 1 {
        stop / (count - 1) as f64
    } else {
        0.0
    };
    for i in 0..count {
        let y = if count > 1 && i == count - 1 {
            stop
        } else {
            i as f64 * step + 0.0
        };
        let index = y as u64; // astype(int): truncation toward zero
        if out.last() != Some(&index) {
            out.push(index);
        }
    }
    out
}

/// The records of `store` that train its dictionary for `tier`, as loaderx
/// picks them (see the module's description).
pub fn sample_indices(store: &Reader, tier: &DictTier) -> Result<Vec<u64>> {
    let total = store.len();
    if total == 0 {
        return Err(Error::invalid(
            "cannot train a zstd dictionary on an empty store",
        ));
    }
    let budget = tier.sample_budget as u64;
    let item = match store.schema().geometry {
        Geometry::Dense { .. } => {
            let row = store.schema().row_bytes().unwrap_or(0);
            if row > budget {
                return Err(Error::invalid(
                    "one training record exceeds the sample budget",
                ));
            }
            row
        }
        Geometry::Ragged { .. } => {
            let preview: Vec<u64> = (0..total.min(32)).collect();
            let batch = store.gather_ragged(&preview)?;
            let sum: u64 = batch.offsets.windows(2).map(|w| w[1] - w[0]).sum();
            // numpy's int(np.mean(...)): an exact float sum (under 2^53),
            // one division, truncated; 0 becomes 1.
            ((sum as f64 / preview.len() as f64) as u64).max(1)
        }
    };
    Ok(spread_indices(total, sample_count(total, item, budget)))
}

/// Train `store`'s dictionary for `tier` on the records loaderx would pick
/// ([`sample_indices`]), laid end to end; a Ragged store's samples stop
/// before the first that would pass the budget.
pub fn train_store_dict(store: &Reader, tier: &DictTier) -> Result<Vec<u8>> {
    let indices = sample_indices(store, tier)?;
    let budget = tier.sample_budget;
    match store.schema().geometry {
        Geometry::Dense { .. } => {
            let row = store.schema().row_bytes().unwrap_or(0) as usize;
            let mut samples =
                crate::reader::try_vec(indices.len() * row, store.path(), "dictionary samples")?;
            samples.resize(indices.len() * row, 0u8);
            store.gather_dense(&indices, &mut samples)?;
            let sizes = vec![row; indices.len()];
            train_dict(&samples, &sizes, tier.dict_bytes)
        }
        Geometry::Ragged { .. } => {
            let batch = store.gather_ragged(&indices)?;
            let (mut sizes, mut total) = (Vec::new(), 0usize);
            for w in batch.offsets.windows(2) {
                let size = (w[1] - w[0]) as usize;
                if size == 0 {
                    return Err(Error::invalid(
                        "zero-byte records cannot train a zstd dictionary",
                    ));
                }
                if size > budget - total {
                    if sizes.is_empty() {
                        return Err(Error::invalid(
                            "one training record exceeds the sample budget",
                        ));
                    }
                    break;
                }
                sizes.push(size);
                total += size;
                if total == budget {
                    break;
                }
            }
            train_dict(&batch.values()[..total], &sizes, tier.dict_bytes)
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn spread_indices_are_numpys_linspace_truncated_and_unique() {
        // numpy.unique(numpy.linspace(0, n - 1, k).astype(int)), computed
        // with numpy 2.4 for these cases.
        assert_eq!(spread_indices(10, 1), [0]);
        assert_eq!(spread_indices(10, 2), [0, 9]);
        assert_eq!(spread_indices(10, 4), [0, 3, 6, 9]);
        assert_eq!(spread_indices(10, 10), (0..10).collect::<Vec<_>>());
        assert_eq!(spread_indices(5, 8), [0, 1, 2, 3, 4]);
        assert_eq!(spread_indices(1, 3), [0]);
        assert_eq!(spread_indices(7, 3), [0, 3, 6]);
        assert_eq!(spread_indices(100, 7), [0, 16, 33, 49, 66, 82, 99]);
        assert!(spread_indices(0, 3).is_empty());
    }

    #[test]
    fn sample_count_is_at_least_one_and_at_most_the_records() {
        assert_eq!(sample_count(10, 0, 100), 10);
        assert_eq!(sample_count(10, 1000, 100), 1);
        assert_eq!(sample_count(1000, 10, 100), 10);
    }
}
