//! A fast, per-process seeded hasher for the data-path maps (relay address and client 5-tuple
//! lookups on every packet). Keys are socket addresses: short, fixed-size writes for which
//! SipHash is slow. The random seed keeps collisions from being precomputed, and entries are
//! only ever inserted for authenticated allocations (bounded by the quotas).

use std::hash::{BuildHasher, Hasher};

/// Builds [`FastHasher`]s with one random seed.
#[derive(Clone, Copy, Debug)]
pub(crate) struct Seeded(u64);

impl Seeded {
    pub(crate) fn random() -> Seeded {
        Seeded(rand::random::<u64>() | 1)
    }
}

impl BuildHasher for Seeded {
    type Hasher = FastHasher;

    fn build_hasher(&self) -> FastHasher {
        FastHasher(self.0)
    }
}

/// Multiply-rotate mixing with a final avalanche.
pub(crate) struct FastHasher(u64);

impl FastHasher {
    #[inline]
    fn add(&mut self, v: u64) {
        self.0 = (self.0.rotate_left(5) ^ v).wrapping_mul(0x517c_c1b7_2722_0a95);
    }
}

impl Hasher for FastHasher {
    #[inline]
    fn write(&mut self, bytes: &[u8]) {
        for chunk in bytes.chunks(8) {
            let mut b = [0u8; 8];
            b[..chunk.len()].copy_from_slice(chunk);
            self.add(u64::from_le_bytes(b));
        }
    }

    #[inline]
    fn write_u8(&mut self, i: u8) {
        self.add(u64::from(i));
    }

    #[inline]
    fn write_u16(&mut self, i: u16) {
        self.add(u64::from(i));
    }

    #[inline]
    fn write_u32(&mut self, i: u32) {
        self.add(u64::from(i));
    }

    #[inline]
    fn write_u64(&mut self, i: u64) {
        self.add(i);
    }

    #[inline]
    fn write_usize(&mut self, i: usize) {
        self.add(i as u64);
    }

    #[inline]
    fn finish(&self) -> u64 {
        let mut h = self.0;
        h ^= h >> 33;
        h = h.wrapping_mul(0xff51_afd7_ed55_8ccd);
        h ^= h >> 33;
        h
    }
}
