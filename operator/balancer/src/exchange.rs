//! The gradient exchange in the step-time model, from the figures every
//! rank measures at start-up: a small all-reduce's latency, and the
//! bandwidth of its slowest link (rank to rank, else the group's all-reduce
//! bus bandwidth). A ring all-reduce of `G` gradient bytes among `k` ranks
//! moves `2(k − 1)/k · G` bytes over each rank's link, so it takes
//!
//! ```text
//! exchange(S) = max latency over S + 2(k − 1)/k · G / min bandwidth over S
//! ```
//!
//! and nothing for a single rank. Leaving a rank out of the step also
//! takes it out of the exchange (the trainers use a sub-group), so a rank
//! on a slow link can cost more than its samples save even when its device
//! is fast. The trainer overlaps much of the exchange with backward, so
//! the model is scaled by the fraction the steps were measured to expose;
//! before that measurement it is only an upper bound: it is reported (the
//! communication a plan predicts) but does not decide membership.

/// One rank's start-up communication figures.
#[derive(Debug, Clone, Copy, PartialEq)]
pub(crate) struct Link {
    /// Seconds of a small all-reduce.
    pub latency_seconds: f64,
    /// Bytes/s of its slowest link.
    pub bandwidth_bytes_per_second: f64,
}

/// Seconds of one ring all-reduce of `gradient_bytes` among the ranks whose
/// `links` are given; 0 for fewer than two.
pub(crate) fn ring_seconds<'a>(
    gradient_bytes: f64,
    links: impl IntoIterator<Item = &'a Link>,
) -> f64 {
    let (mut k, mut latency, mut bandwidth) = (0usize, 0.0f64, f64::INFINITY);
    for l in links {
        k += 1;
        latency = latency.max(l.latency_seconds);
        bandwidth = bandwidth.min(l.bandwidth_bytes_per_second);
    }
    if k < 2 {
        return 0.0;
    }
    let k = k as f64;
    latency + 2.0 * (k - 1.0) / k * gradient_bytes / bandwidth
}

/// The exchange model of a job: `None` unless the gradient size and every
/// rank's figures are known (a partial model would favour the ranks
/// without figures).
pub(crate) fn model(gradient_bytes: Option<f64>, links: Vec<Option<Link>>) -> Option<Model> {
    let g = gradient_bytes?;
    links.iter().all(Option::is_some).then_some(Model {
        g,
        links,
        exposed: 1.0,
        measured: false,
    })
}

/// See [`model`].
#[derive(Debug, Clone)]
pub(crate) struct Model {
    g: f64,
    links: Vec<Option<Link>>,
    /// The fraction of the exchange a step exposes (not hidden behind
    /// backward), in [0, 1]; 1 until live measurements say otherwise.
    exposed: f64,
    /// `exposed` comes from a live measurement.
    measured: bool,
}

impl Model {
    /// Count only the fraction of the exchange the steps were measured to
    /// expose: live exposed communication over what this model predicts
    /// for the membership that ran (`batches`); unchanged when either is 0.
    pub fn calibrated(mut self, live_seconds: Option<f64>, batches: &[u32]) -> Model {
        let predicted = self.seconds(batches);
        if let Some(live) = live_seconds.filter(|&l| l.is_finite() && l > 0.0 && predicted > 0.0) {
            self.exposed = (live / predicted).clamp(0.0, 1.0);
            self.measured = true;
        }
        self
    }

    /// Whether live measurements calibrated the exposed fraction. Until
    /// then the model is an upper bound (no overlap with backward), good
    /// for reporting but not for leaving ranks out.
    pub fn is_calibrated(&self) -> bool {
        self.measured
    }

    /// Seconds of the exchange among the ranks that train under `batches`
    /// (batch > 0).
    pub fn seconds(&self, batches: &[u32]) -> f64 {
        self.exposed
            * ring_seconds(
                self.g,
                self.links
                    .iter()
                    .zip(batches)
                    .filter(|(_, &b)| b > 0)
                    .filter_map(|(l, _)| l.as_ref()),
            )
    }

    /// What `rank` adds to the exchange of the ranks that train under
    /// `batches` (assumed to include it).
    pub fn marginal(&self, batches: &[u32], rank: usize) -> f64 {
        let mut without = batches.to_vec();
        if let Some(b) = without.get_mut(rank) {
            *b = 0;
        }
        self.seconds(batches) - self.seconds(&without)
    }

    /// The bandwidth of `rank`'s slowest link, bytes/s.
    pub fn bandwidth(&self, rank: usize) -> Option<f64> {
        self.links
            .get(rank)
            .copied()
            .flatten()
            .map(|l| l.bandwidth_bytes_per_second)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn link(latency_seconds: f64, bandwidth_bytes_per_second: f64) -> Option<Link> {
        Some(Link {
            latency_seconds,
            bandwidth_bytes_per_second,
        })
    }

    #[test]
    fn ring_all_reduce_moves_two_k_minus_one_over_k_of_the_gradient() {
        let links = [link(1e-3, 1e9), link(2e-3, 1e9), link(1e-3, 0.5e9)];
        let m = model(Some(1e9), links.to_vec()).unwrap();
        // Alone: no exchange.
        assert_eq!(m.seconds(&[8, 0, 0]), 0.0);
        // Two ranks: 1 × G / 1e9 plus the larger latency.
        assert!((m.seconds(&[8, 8, 0]) - (2e-3 + 1.0)).abs() < 1e-12);
        // Three: 4/3 × G over the slowest link (0.5e9).
        assert!((m.seconds(&[8, 8, 8]) - (2e-3 + 4.0 / 3.0 * 2.0)).abs() < 1e-12);
        // The slow link's rank adds the most.
        assert!(m.marginal(&[8, 8, 8], 2) > m.marginal(&[8, 8, 8], 1));
        assert_eq!(m.bandwidth(2), Some(0.5e9));
    }

    #[test]
    fn no_model_without_every_rank_or_the_gradient_size() {
        assert!(model(None, vec![link(1e-3, 1e9), link(1e-3, 1e9)]).is_none());
        assert!(model(Some(1e6), vec![link(1e-3, 1e9), None]).is_none());
    }
}
