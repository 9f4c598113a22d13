//! The heterogeneous sampler: each step takes the next B indices of the
//! epoch's seeded permutation (or in order), and rank r takes the slice that
//! starts at the prefix sum of the plan's local batches before it.

use heterotrain_crds::BatchPlan;

/// SplitMix64: a tiny, fully specified RNG so index order never depends on
/// libtorch's generator or on the thread count.
#[derive(Clone, Debug)]
pub struct SplitMix64(u64);

impl SplitMix64 {
    pub fn new(seed: u64) -> Self {
        SplitMix64(seed)
    }

    pub fn next_u64(&mut self) -> u64 {
        self.0 = self.0.wrapping_add(0x9E37_79B9_7F4A_7C15);
        let mut z = self.0;
        z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
        z ^ (z >> 31)
    }

    /// Uniform in [0, n) (n > 0), by rejection so it is unbiased.
    pub fn below(&mut self, n: u64) -> u64 {
        let zone = u64::MAX - (u64::MAX % n);
        loop {
            let v = self.next_u64();
            if v < zone {
                return v % n;
            }
        }
    }

    /// Uniform in [0, 1).
    pub fn unit_f64(&mut self) -> f64 {
        (self.next_u64() >> 11) as f64 / (1u64 << 53) as f64
    }

    /// Standard normal (Box-Muller).
    pub fn normal(&mut self) -> f64 {
        let u1 = self.unit_f64().max(f64::MIN_POSITIVE);
        let u2 = self.unit_f64();
        (-2.0 * u1.ln()).sqrt() * (2.0 * std::f64::consts::PI * u2).cos()
    }
}

/// Where the sampler is; saved in checkpoints.
#[derive(Clone, Copy, Debug, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
pub struct SamplerPosition {
    pub epoch: u64,
    pub step_in_epoch: u64,
}

/// Index order of one epoch over `n` samples.
pub fn epoch_order(n: usize, seed: u64, epoch: u64, shuffle: bool) -> Vec<usize> {
    let mut idx: Vec<usize> = (0..n).collect();
    if shuffle {
        let mut rng =
            SplitMix64::new(seed ^ 0x5EED_0000_0000_0000 ^ epoch.wrapping_mul(0x1000_0001));
        for i in (1..n).rev() {
            let j = rng.below(i as u64 + 1) as usize;
            idx.swap(i, j);
        }
    }
    idx
}

/// Steps per epoch with global batch B (the incomplete tail is dropped, so
/// every step trains on exactly B samples).
pub fn steps_per_epoch(n: usize, global_batch: u32) -> u64 {
    (n / global_batch.max(1) as usize) as u64
}

/// Per-rank view of the epoch permutation.
#[derive(Clone, Debug)]
pub struct HeteroSampler {
    n: usize,
    seed: u64,
    shuffle: bool,
    epoch: u64,
    order: Vec<usize>,
}

impl HeteroSampler {
    pub fn new(n: usize, seed: u64, shuffle: bool) -> Self {
        HeteroSampler {
            n,
            seed,
            shuffle,
            epoch: 0,
            order: epoch_order(n, seed, 0, shuffle),
        }
    }

    fn set_epoch(&mut self, epoch: u64) {
        if epoch != self.epoch {
            self.epoch = epoch;
            self.order = epoch_order(self.n, self.seed, epoch, self.shuffle);
        }
    }

    /// The global batch of step `pos` (all B indices).
    pub fn global_indices(&mut self, pos: SamplerPosition, global_batch: u32) -> &[usize] {
        self.set_epoch(pos.epoch);
        let b = global_batch as usize;
        let start = pos.step_in_epoch as usize * b;
        &self.order[start..start + b]
    }

    /// Rank `rank`'s slice of step `pos` under `plan`.
    pub fn rank_indices(
        &mut self,
        pos: SamplerPosition,
        plan: &BatchPlan,
        rank: usize,
    ) -> Vec<usize> {
        let off = plan.offset_of(rank);
        let len = plan.batch_sizes[rank] as usize;
        self.global_indices(pos, plan.global_batch_size)[off..off + len].to_vec()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn plan(sizes: &[u32]) -> BatchPlan {
        let mut p = BatchPlan::equal(1, sizes.iter().sum(), sizes.len());
        p.batch_sizes = sizes.to_vec();
        p
    }

    #[test]
    fn slices_partition_the_global_batch() {
        let p = plan(&[20, 9, 3]);
        let mut s = HeteroSampler::new(100, 7, true);
        let pos = SamplerPosition {
            epoch: 2,
            step_in_epoch: 1,
        };
        let all: Vec<usize> = (0..3).flat_map(|r| s.rank_indices(pos, &p, r)).collect();
        assert_eq!(all.len(), 32);
        assert_eq!(all, s.global_indices(pos, 32).to_vec());
        assert_eq!(s.rank_indices(pos, &p, 2).len(), 3);
        let mut sorted = all.clone();
        sorted.sort_unstable();
        sorted.dedup();
        assert_eq!(sorted.len(), 32, "no index twice in a step");
    }

    #[test]
    fn permutation_depends_on_seed_and_epoch_only() {
        let a = epoch_order(1000, 3, 5, true);
        assert_eq!(a, epoch_order(1000, 3, 5, true));
        assert_ne!(a, epoch_order(1000, 3, 6, true));
        assert_ne!(a, epoch_order(1000, 4, 5, true));
        let mut s = a.clone();
        s.sort_unstable();
        assert_eq!(s, (0..1000).collect::<Vec<_>>());
        assert_eq!(epoch_order(5, 3, 5, false), vec![0, 1, 2, 3, 4]);
    }

    #[test]
    fn no_shuffle_takes_samples_in_order() {
        let p = plan(&[2, 1]);
        let mut s = HeteroSampler::new(10, 0, false);
        let pos = SamplerPosition {
            epoch: 0,
            step_in_epoch: 2,
        };
        assert_eq!(s.rank_indices(pos, &p, 0), vec![6, 7]);
        assert_eq!(s.rank_indices(pos, &p, 1), vec![8]);
        assert_eq!(steps_per_epoch(10, 3), 3);
    }
}
