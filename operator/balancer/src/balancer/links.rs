//! Start-up link figures and the gradient exchange they predict.

use super::Balancer;
use crate::exchange::{self, Link};
use crate::BalancerError;

impl Balancer {
    /// The communication per step that no split removes: the smallest
    /// smoothed exposed communication over the ranks that train (not those
    /// left out of the last decided plan). Under a balanced
    /// plan the rank on the critical path waits for nobody, so what it
    /// reports is the exchange itself; the others add their waiting on
    /// top. Before any live measurement, the exchange the start-up figures
    /// predict for those ranks ([`Balancer::observe_link`]); else 0.
    pub fn communication_seconds(&self) -> f64 {
        self.live_communication()
            .or_else(|| Some(self.exchange()?.seconds(&self.members())))
            .unwrap_or(0.0)
    }

    /// The smallest smoothed exposed communication over the ranks that
    /// train.
    fn live_communication(&self) -> Option<f64> {
        self.ranks
            .iter()
            .filter(|r| !r.left_out)
            .filter_map(|r| r.communication)
            .reduce(f64::min)
    }

    /// 1 for each rank that trains (not left out of the last plan), else 0.
    fn members(&self) -> Vec<u32> {
        self.ranks.iter().map(|r| u32::from(!r.left_out)).collect()
    }

    /// Start-up communication figures of `rank`: the seconds of a small
    /// all-reduce and the bytes/s of its slowest link (rank to rank, else
    /// the group's all-reduce bus bandwidth). With every rank's figures and
    /// [`Balancer::set_gradient_bytes`], the balancer predicts each
    /// membership's gradient exchange (see `exchange.rs`): the
    /// communication it reports before live measurements, and, once the
    /// live exposed communication calibrated it, a term of the step when
    /// it chooses which ranks train.
    pub fn observe_link(
        &mut self,
        rank: usize,
        latency_seconds: f64,
        bandwidth_bytes_per_second: f64,
    ) -> Result<(), BalancerError> {
        let r = self.rank_mut(rank)?;
        if !(latency_seconds.is_finite()
            && latency_seconds >= 0.0
            && bandwidth_bytes_per_second.is_finite()
            && bandwidth_bytes_per_second > 0.0)
        {
            return Err(BalancerError::InvalidSample {
                rank,
                reason: format!(
                    "latency {latency_seconds} s, link bandwidth {bandwidth_bytes_per_second} B/s"
                ),
            });
        }
        r.link = Some(Link {
            latency_seconds,
            bandwidth_bytes_per_second,
        });
        Ok(())
    }

    /// Bytes of gradient each step exchanges (the model's trainable
    /// parameters); 0 forgets it.
    pub fn set_gradient_bytes(&mut self, bytes: u64) {
        self.gradient_bytes = (bytes > 0).then_some(bytes as f64);
    }

    /// Seconds of the gradient exchange among the ranks that train under
    /// `batches` that the step exposes, as the start-up figures predict
    /// it (scaled by the exposed fraction measured live, once there is
    /// one); `None` until every rank's figures and the gradient size are
    /// known.
    pub fn predicted_exchange_seconds(&self, batches: &[u32]) -> Option<f64> {
        Some(self.exchange()?.seconds(batches))
    }

    /// The exchange model, when every rank has figures.
    /// Calibrated by the live exposed communication: with overlap only
    /// part of the exchange lengthens the step.
    pub(crate) fn exchange(&self) -> Option<exchange::Model> {
        let m = exchange::model(
            self.gradient_bytes,
            self.ranks.iter().map(|r| r.link).collect(),
        )?;
        Some(m.calibrated(self.live_communication(), &self.members()))
    }
}
