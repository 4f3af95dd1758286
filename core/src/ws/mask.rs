//! Client masking (RFC 6455 §5.3), a word at a time, and the pool of
//! caller-supplied random bytes the masking keys come from.

/// Bytes of randomness the pool holds (1,024 masking keys).
pub const MASK_POOL_BYTES: usize = 4_096;

/// Below this many buffered bytes the pool asks for more.
const MASK_POOL_LOW_WATER: usize = MASK_POOL_BYTES / 2;

/// Bytes masked per block when copying: small enough that the copied block
/// is still in L1 when it is masked in place.
const BLOCK: usize = 4_096;

/// XORs `buf` with the 4-byte `mask` repeated, starting at mask offset 0.
/// Works on 8-byte words (the compiler widens the loop to vector registers);
/// only a tail shorter than a word is touched byte by byte.
#[inline]
pub fn apply_mask(buf: &mut [u8], mask: [u8; 4]) {
    let word = mask_word(mask);
    let mut chunks = buf.chunks_exact_mut(8);
    for chunk in &mut chunks {
        let mut w = [0u8; 8];
        w.copy_from_slice(chunk);
        chunk.copy_from_slice(&(u64::from_ne_bytes(w) ^ word).to_ne_bytes());
    }
    // The tail starts at a multiple of 8, so mask offset 0 again.
    for (b, m) in chunks.into_remainder().iter_mut().zip(mask.iter().cycle()) {
        *b ^= m;
    }
}

/// Appends `src` masked with `mask` to `out`, in L1-sized blocks (copy, then
/// mask in place while the block is hot).
#[inline]
pub fn extend_masked(out: &mut Vec<u8>, src: &[u8], mask: [u8; 4]) {
    out.reserve(src.len());
    // BLOCK is a multiple of 4, so every block starts at mask offset 0.
    for block in src.chunks(BLOCK) {
        let start = out.len();
        out.extend_from_slice(block);
        apply_mask(&mut out[start..], mask);
    }
}

/// Writes `src` masked with `mask` into `dst` (same length) in one pass:
/// 32-byte blocks XORed with a 32-byte key pattern (fixed-size arrays, which
/// the compiler turns into vector loads, XORs and stores), then 8-byte
/// words, then a tail shorter than a word.
///
/// # Panics
/// When `dst` and `src` differ in length (a caller bug).
#[inline]
pub fn copy_masked(dst: &mut [u8], src: &[u8], mask: [u8; 4]) {
    assert_eq!(dst.len(), src.len(), "copy_masked needs equal lengths");
    let word = mask_word(mask);
    let mut pattern = [0u8; 32];
    for (p, k) in pattern.chunks_exact_mut(8).zip([word; 4]) {
        p.copy_from_slice(&k.to_ne_bytes());
    }
    let mut d32 = dst.chunks_exact_mut(32);
    let mut s32 = src.chunks_exact(32);
    for (d, s) in (&mut d32).zip(&mut s32) {
        let (Ok(d), Ok(s)) = (<&mut [u8; 32]>::try_from(d), <&[u8; 32]>::try_from(s)) else {
            unreachable!("chunks_exact yields 32-byte chunks");
        };
        for i in 0..32 {
            d[i] = s[i] ^ pattern[i];
        }
    }
    // Offsets stay multiples of 8, so the key phase is unchanged.
    let (d, s) = (d32.into_remainder(), s32.remainder());
    let mut d8 = d.chunks_exact_mut(8);
    let mut s8 = s.chunks_exact(8);
    for (d, s) in (&mut d8).zip(&mut s8) {
        let mut w = [0u8; 8];
        w.copy_from_slice(s);
        d.copy_from_slice(&(u64::from_ne_bytes(w) ^ word).to_ne_bytes());
    }
    let (d, s) = (d8.into_remainder(), s8.remainder());
    let mut w = [0u8; 8];
    w[..s.len()].copy_from_slice(s);
    let masked = (u64::from_ne_bytes(w) ^ word).to_ne_bytes();
    d.copy_from_slice(&masked[..d.len()]);
}

/// The 4-byte key repeated into a native-order word.
#[inline]
fn mask_word(mask: [u8; 4]) -> u64 {
    let mut w = [0u8; 8];
    w[..4].copy_from_slice(&mask);
    w[4..].copy_from_slice(&mask);
    u64::from_ne_bytes(w)
}

/// Caller-supplied randomness for masking keys, consumed 4 bytes per frame.
#[derive(Clone)]
pub(crate) struct MaskPool {
    buf: Vec<u8>,
    pos: usize,
}

impl MaskPool {
    pub(crate) fn new() -> Self {
        Self {
            buf: Vec::with_capacity(MASK_POOL_BYTES),
            pos: 0,
        }
    }

    /// Bytes buffered and not yet used.
    pub(crate) fn available(&self) -> usize {
        self.buf.len() - self.pos
    }

    /// How many bytes the caller should add (0 while at least half full).
    pub(crate) fn wanted(&self) -> usize {
        let avail = self.available();
        if avail < MASK_POOL_LOW_WATER {
            MASK_POOL_BYTES - avail
        } else {
            0
        }
    }

    /// Adds random bytes; any beyond the pool's room are ignored.
    pub(crate) fn add(&mut self, random: &[u8]) {
        if self.pos > 0 {
            self.buf.drain(..self.pos);
            self.pos = 0;
        }
        let room = MASK_POOL_BYTES - self.buf.len();
        self.buf
            .extend_from_slice(&random[..random.len().min(room)]);
    }

    /// The next masking key, or `None` when the pool is empty.
    #[inline]
    pub(crate) fn take(&mut self) -> Option<[u8; 4]> {
        let bytes = self.buf.get(self.pos..self.pos + 4)?;
        let key = [bytes[0], bytes[1], bytes[2], bytes[3]];
        self.pos += 4;
        Some(key)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn naive(buf: &[u8], mask: [u8; 4]) -> Vec<u8> {
        buf.iter()
            .enumerate()
            .map(|(i, b)| b ^ mask[i % 4])
            .collect()
    }

    #[test]
    fn word_masking_matches_the_definition_for_every_tail() {
        let mask = [0x37, 0xfa, 0x21, 0x3d];
        for len in 0..70 {
            let src: Vec<u8> = (0..len).map(|i| (i * 7 + 3) as u8).collect();
            let mut a = src.clone();
            apply_mask(&mut a, mask);
            assert_eq!(a, naive(&src, mask), "len {len}");
            let mut b = vec![9];
            extend_masked(&mut b, &src, mask);
            assert_eq!(&b[1..], &naive(&src, mask)[..]);
            let mut c = vec![0; len];
            copy_masked(&mut c, &src, mask);
            assert_eq!(c, naive(&src, mask), "copy_masked len {len}");
        }
        let big: Vec<u8> = (0..10_000u32).map(|i| i as u8).collect();
        let mut out = Vec::new();
        extend_masked(&mut out, &big, mask);
        assert_eq!(out, naive(&big, mask));
    }

    #[test]
    fn pool_hands_out_keys_in_order_and_runs_dry() {
        let mut pool = MaskPool::new();
        assert_eq!(pool.wanted(), MASK_POOL_BYTES);
        pool.add(&[1, 2, 3, 4, 5, 6, 7, 8, 9]);
        assert_eq!(pool.take(), Some([1, 2, 3, 4]));
        assert_eq!(pool.take(), Some([5, 6, 7, 8]));
        assert_eq!(pool.take(), None);
        pool.add(&vec![0; 10_000]);
        assert_eq!(pool.available(), MASK_POOL_BYTES);
        assert_eq!(pool.wanted(), 0);
    }
}
