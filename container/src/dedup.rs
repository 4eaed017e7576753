//! The one rule by which `.zt` writers share blobs: byte-identical decoded
//! parts share one blob. A blob is known by its key (the XXH3-64 digest the
//! manifest stores anyway, the decoded length, and whether it is encoded);
//! a key match only names candidates, and the bytes are compared before
//! anything is shared, so a digest collision can never alias two tensors.
//!
//! Every write path keeps one [`Seen`] table: the batch writer's scout
//! (parts in memory, compared in memory), the compressed batch path, and the
//! incremental writer (blobs on disk, compared against the file).

use std::collections::HashMap;

use zt_core::catalog::Digest;

/// What identifies a blob's content up to a byte comparison.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub(crate) struct BlobKey {
    digest: u64,
    decoded_len: u64,
    encoded: bool,
}

impl BlobKey {
    /// The key of a part with `digest` over its `decoded_len` decoded bytes,
    /// stored raw or encoded.
    pub(crate) fn new(digest: &Digest, decoded_len: u64, encoded: bool) -> BlobKey {
        let digest = match digest {
            Digest::Xxh3(v) => *v,
            Digest::Sha256(b) => u64::from_le_bytes(b[..8].try_into().expect("8 bytes")),
        };
        BlobKey {
            digest,
            decoded_len,
            encoded,
        }
    }
}

/// The blobs stored so far, by key; `T` says where each one is (a part
/// index, or an offset and stored length in the file).
#[derive(Debug)]
pub(crate) struct Seen<T> {
    by_key: HashMap<BlobKey, Vec<T>>,
}

impl<T> Default for Seen<T> {
    fn default() -> Self {
        Seen {
            by_key: HashMap::new(),
        }
    }
}

impl<T: Copy> Seen<T> {
    /// The first stored blob under `key` whose bytes `same` confirms equal.
    pub(crate) fn find<E>(
        &self,
        key: &BlobKey,
        mut same: impl FnMut(T) -> Result<bool, E>,
    ) -> Result<Option<T>, E> {
        for &candidate in self.by_key.get(key).into_iter().flatten() {
            if same(candidate)? {
                return Ok(Some(candidate));
            }
        }
        Ok(None)
    }

    /// Remember a newly stored blob.
    pub(crate) fn record(&mut self, key: BlobKey, at: T) {
        self.by_key.entry(key).or_default().push(at);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_key_match_shares_only_when_the_bytes_agree() {
        let blobs: [&[u8]; 2] = [b"abcd", b"abce"];
        let key = BlobKey::new(&Digest::Xxh3(7), 4, false);
        let mut seen = Seen::default();
        seen.record(key, 0usize);
        let same = |j: usize| Ok::<_, ()>(blobs[j] == b"abce");
        assert_eq!(seen.find(&key, same), Ok(None), "same key, other bytes");
        seen.record(key, 1);
        assert_eq!(seen.find(&key, same), Ok(Some(1)));
        let other = BlobKey::new(&Digest::Xxh3(7), 4, true);
        assert_eq!(
            seen.find(&other, |_| Ok::<_, ()>(true)),
            Ok(None),
            "encoded apart"
        );
    }
}
