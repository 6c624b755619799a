//! Cache-line padding for data that one shard writes and others only read
//! (per-shard counters, gauges, doorbells).
//!
//! 128 bytes rather than 64: x86's adjacent-line prefetcher pulls lines in
//! 128-byte-aligned pairs, so two writers 64 bytes apart still slow each
//! other down. A value in [`Padded`] starts on a 128-byte boundary and
//! its size is a multiple of 128, so nothing else shares its lines; a
//! [`PaddedSlice`] gives a heap array the same guarantee (a plain
//! `Box<[T]>` of small elements may sit in the same line as another
//! shard's allocation, since the allocator packs them side by side).

use std::ops::Deref;

/// The line size padded to.
pub const LINE: usize = 128;

/// `T` alone on its cache lines.
#[derive(Debug, Default)]
#[repr(align(128))]
pub struct Padded<T>(pub T);

impl<T> Deref for Padded<T> {
    type Target = T;
    fn deref(&self) -> &T {
        &self.0
    }
}

/// A fixed-length array of `T` on the heap whose allocation shares no
/// cache line with any other: elements are stored `N` to a padded chunk.
/// Pick `N` so that `N * size_of::<T>()` is a multiple of [`LINE`], and no
/// byte is wasted between chunks.
#[derive(Debug)]
pub struct PaddedSlice<T, const N: usize> {
    chunks: Box<[Padded<[T; N]>]>,
    len: usize,
}

impl<T: Default, const N: usize> PaddedSlice<T, N> {
    /// `len` default elements (rounded up to whole chunks internally).
    pub fn new(len: usize) -> Self {
        let chunks = len.div_ceil(N.max(1));
        Self {
            chunks: (0..chunks)
                .map(|_| Padded(std::array::from_fn(|_| T::default())))
                .collect(),
            len,
        }
    }
}

impl<T, const N: usize> PaddedSlice<T, N> {
    pub fn len(&self) -> usize {
        self.len
    }

    pub fn is_empty(&self) -> bool {
        self.len == 0
    }

    pub fn get(&self, i: usize) -> Option<&T> {
        if i >= self.len {
            return None;
        }
        self.chunks.get(i / N).map(|c| &c.0[i % N])
    }

    pub fn iter(&self) -> impl Iterator<Item = &T> {
        self.chunks.iter().flat_map(|c| c.0.iter()).take(self.len)
    }
}

#[cfg(test)]
mod tests {
    use std::sync::atomic::AtomicU64;

    use super::*;

    #[test]
    fn padded_values_own_their_lines() {
        assert_eq!(std::mem::align_of::<Padded<u8>>(), LINE);
        assert_eq!(std::mem::size_of::<Padded<u8>>(), LINE);
        assert_eq!(std::mem::size_of::<Padded<[u8; 129]>>(), 2 * LINE);
    }

    #[test]
    fn a_padded_slice_is_aligned_and_whole_lines() {
        let s: PaddedSlice<AtomicU64, 16> = PaddedSlice::new(3);
        assert_eq!(s.len(), 3);
        assert_eq!(s.iter().count(), 3);
        let first = s.get(0).map(|a| a as *const _ as usize);
        assert_eq!(first.map(|p| p % LINE), Some(0));
        assert!(s.get(3).is_none());
        let big: PaddedSlice<u64, 16> = PaddedSlice::new(40);
        assert_eq!(big.iter().count(), 40);
        assert_eq!(std::mem::size_of_val(&*big.chunks) % LINE, 0);
    }
}
