//! Maps keyed by scheduler keys ([`super::Target::key`]): integers the
//! server hands out from a counter, looked up on every request (the
//! shard's model by key, the scheduler host's schedulers). std's SipHash
//! guards against keys an attacker picks, which these never are, and cost
//! about 140 instructions a lookup under callgrind; one multiplication by
//! an odd constant spreads them (distinct low bits stay distinct, and the
//! high bits hashbrown tags its slots with vary).

use std::{
    collections::HashMap,
    hash::{BuildHasherDefault, Hasher},
};

pub type KeyMap<V> = HashMap<u64, V, BuildHasherDefault<KeyHasher>>;

const SPREAD: u64 = 0x9e37_79b9_7f4a_7c15;

#[derive(Default)]
pub struct KeyHasher(u64);

impl Hasher for KeyHasher {
    fn finish(&self) -> u64 {
        self.0
    }

    fn write(&mut self, bytes: &[u8]) {
        for &b in bytes {
            self.0 = (self.0.rotate_left(8) ^ u64::from(b)).wrapping_mul(SPREAD);
        }
    }

    fn write_u64(&mut self, n: u64) {
        self.0 = (self.0 ^ n).wrapping_mul(SPREAD);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn counter_keys_spread_over_low_and_high_bits() {
        let hash = |k: u64| {
            let mut h = KeyHasher::default();
            h.write_u64(k);
            h.finish()
        };
        let low: std::collections::HashSet<u64> = (1..=256).map(|k| hash(k) & 0xff).collect();
        assert_eq!(low.len(), 256, "distinct keys share low bits");
        let tags: std::collections::HashSet<u64> = (1..=256).map(|k| hash(k) >> 57).collect();
        assert!(
            tags.len() > 64,
            "only {} distinct top-7-bit tags",
            tags.len()
        );
        let mut m = KeyMap::default();
        for k in 1..=1000u64 {
            m.insert(k, k * 2);
        }
        assert!((1..=1000u64).all(|k| m.get(&k) == Some(&(k * 2))));
    }
}
