//! A small seeded PRNG and the size distributions the workload draws from.
//!
//! [`SplitMix64`] is Steele, Lea and Flood's 64-bit mixer: one add and three
//! xor-shift-multiply rounds per draw. It is fast, has a full 2^64 period, and the same
//! seed gives the same stream on every platform, which is all a workload generator
//! needs (it is not a cryptographic generator).

/// A SplitMix64 generator.
#[derive(Clone, Debug)]
pub struct SplitMix64 {
    state: u64,
}

impl SplitMix64 {
    /// A generator seeded with `seed`.
    pub fn new(seed: u64) -> SplitMix64 {
        SplitMix64 { state: seed }
    }

    /// An independent generator for stream `index`, derived from `seed`.
    pub fn derive(seed: u64, index: u64) -> SplitMix64 {
        let mut g = SplitMix64::new(seed ^ index.wrapping_mul(0xD134_2543_DE82_EF95));
        g.next_u64();
        g
    }

    /// The next 64 random bits.
    pub fn next_u64(&mut self) -> u64 {
        self.state = self.state.wrapping_add(0x9E37_79B9_7F4A_7C15);
        let mut z = self.state;
        z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
        z ^ (z >> 31)
    }

    /// A uniform float in `[0, 1)`.
    pub fn unit(&mut self) -> f64 {
        (self.next_u64() >> 11) as f64 / (1u64 << 53) as f64
    }

    /// True with probability `p`.
    pub fn chance(&mut self, p: f64) -> bool {
        self.unit() < p
    }

    /// A uniform integer in `[low, high]` (inclusive).
    pub fn range(&mut self, low: u64, high: u64) -> u64 {
        debug_assert!(low <= high);
        low + self.next_u64() % (high - low + 1)
    }
}

/// A distribution of byte sizes.
#[derive(Clone, Copy, Debug, PartialEq)]
pub enum SizeDist {
    /// Uniform on `[low, high]`.
    Uniform {
        /// Smallest size.
        low: u64,
        /// Largest size.
        high: u64,
    },
    /// Log-uniform on `[low, high]`: the logarithm of the size is uniform, so every
    /// doubling of size is equally likely. The median is `sqrt(low * high)`.
    LogUniform {
        /// Smallest size.
        low: u64,
        /// Largest size.
        high: u64,
    },
    /// A Pareto distribution with shape `alpha`, truncated to `[low, high]`: most draws
    /// are near `low`, and a long tail reaches `high`. With `alpha < 1` the tail carries
    /// most of the bytes.
    BoundedPareto {
        /// Smallest size.
        low: u64,
        /// Largest size.
        high: u64,
        /// Tail shape.
        alpha: f64,
    },
}

impl SizeDist {
    /// One draw.
    pub fn sample(&self, rng: &mut SplitMix64) -> u64 {
        match *self {
            SizeDist::Uniform { low, high } => rng.range(low, high),
            SizeDist::LogUniform { low, high } => {
                let (l, h) = ((low as f64).ln(), (high as f64).ln());
                ((l + rng.unit() * (h - l)).exp().round() as u64).clamp(low, high)
            }
            SizeDist::BoundedPareto { low, high, alpha } => {
                // Inverse of the truncated Pareto CDF.
                let (l, h) = (low as f64, high as f64);
                let tail = (l / h).powf(alpha);
                let u = rng.unit();
                let x = l / (1.0 - u * (1.0 - tail)).powf(1.0 / alpha);
                (x.round() as u64).clamp(low, high)
            }
        }
    }

    /// A short description for the report.
    pub fn describe(&self) -> String {
        match *self {
            SizeDist::Uniform { low, high } => format!("uniform {low}..={high} B"),
            SizeDist::LogUniform { low, high } => format!("log-uniform {low}..={high} B"),
            SizeDist::BoundedPareto { low, high, alpha } => {
                format!("bounded Pareto alpha={alpha} on {low}..={high} B")
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn same_seed_same_stream() {
        let mut a = SplitMix64::new(7);
        let mut b = SplitMix64::new(7);
        for _ in 0..100 {
            assert_eq!(a.next_u64(), b.next_u64());
        }
    }

    #[test]
    fn sizes_stay_in_bounds() {
        let mut rng = SplitMix64::new(1);
        let dists = [
            SizeDist::Uniform { low: 10, high: 20 },
            SizeDist::LogUniform { low: 100, high: 4096 },
            SizeDist::BoundedPareto { low: 200, high: 65536, alpha: 0.8 },
        ];
        for d in dists {
            for _ in 0..10_000 {
                let (low, high) = match d {
                    SizeDist::Uniform { low, high }
                    | SizeDist::LogUniform { low, high }
                    | SizeDist::BoundedPareto { low, high, .. } => (low, high),
                };
                let x = d.sample(&mut rng);
                assert!((low..=high).contains(&x), "{d:?} gave {x}");
            }
        }
    }

    #[test]
    fn pareto_has_a_long_tail() {
        let mut rng = SplitMix64::new(3);
        let d = SizeDist::BoundedPareto { low: 200, high: 65536, alpha: 0.8 };
        let mut xs: Vec<u64> = (0..20_000).map(|_| d.sample(&mut rng)).collect();
        xs.sort_unstable();
        let median = xs[xs.len() / 2];
        let p99 = xs[xs.len() * 99 / 100];
        assert!(median < 1024, "median {median}");
        assert!(p99 > 16 * 1024, "p99 {p99}");
    }
}
