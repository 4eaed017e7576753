//! Where blobs go and which are shared.

use super::options::align_up;
use crate::container::FLOOR;
use crate::dedup::Seen;

/// Where blobs go and which are shared: the placement state both write
/// paths use, so they agree byte for byte.
#[derive(Debug, Default)]
pub(super) struct Heap {
    pub(super) cursor: u64,
    /// (offset, stored length) of the blobs written so far.
    pub(super) seen: Seen<(u64, u64)>,
}

impl Heap {
    pub(super) fn place(&mut self, len: u64, align: u64) -> u64 {
        let offset = align_up(self.cursor, align).max(align_up(FLOOR, align));
        self.cursor = offset + len;
        offset
    }
}
