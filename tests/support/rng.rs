//! The seeded generator of every test that draws from a seed (the chaos plan, the bench's order
//! and background pods, e2e_records' annotation corpus): SplitMix64 (Steele, Lea, Flood 2014).
//! Tiny, fast, and its output for a seed never changes, which a crate's generator does not
//! promise across versions; a seed printed by a failed run replays it.

/// SplitMix64 over a 64-bit state.
pub struct Rng(u64);

impl Rng {
    pub fn new(seed: u64) -> Rng {
        Rng(seed)
    }

    pub fn next_u64(&mut self) -> u64 {
        self.0 = self.0.wrapping_add(0x9e37_79b9_7f4a_7c15);
        let mut z = self.0;
        z = (z ^ (z >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
        z ^ (z >> 31)
    }

    /// A number in `0..n` (`n > 0`; the modulo bias is irrelevant at these sizes).
    pub fn below(&mut self, n: u64) -> u64 {
        self.next_u64() % n.max(1)
    }

    /// An index into a collection of `n` elements (`0..n`).
    pub fn index(&mut self, n: usize) -> usize {
        self.below(n as u64) as usize
    }

    /// A number in `0..=max`.
    pub fn upto(&mut self, max: i32) -> i32 {
        self.below(max.max(0) as u64 + 1) as i32
    }

    /// A number in `low..high`.
    pub fn range(&mut self, low: usize, high: usize) -> usize {
        low + self.index(high - low)
    }

    /// One of `items`.
    pub fn pick<T: Copy>(&mut self, items: &[T]) -> T {
        items[self.index(items.len())]
    }

    /// True with probability `percent`/100.
    pub fn chance(&mut self, percent: u64) -> bool {
        self.next_u64() % 100 < percent
    }

    /// Fisher-Yates.
    pub fn shuffle<T>(&mut self, items: &mut [T]) {
        for i in (1..items.len()).rev() {
            items.swap(i, self.index(i + 1));
        }
    }
}
