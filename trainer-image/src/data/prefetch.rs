//! The next step's batch gathered ahead of time, on a helper thread at idle
//! CPU priority (Linux `SCHED_IDLE`): it runs when a core would otherwise
//! wait, in the gradient exchange after backward or for a slower rank, so
//! gathering rows leaves the step's own path. A batch is handed out only
//! for exactly the indices it was gathered for, so the data a step trains
//! on never depends on whether its batch came from here.

use std::sync::mpsc::{channel, Receiver, Sender};
use std::thread::JoinHandle;

use tch::{Device, Tensor};

/// One gathered batch and the indices it holds.
struct Gathered {
    idx: Vec<usize>,
    x: Tensor,
    y: Tensor,
}

/// The helper thread and the one request it may have in flight.
pub struct Prefetcher {
    requests: Option<Sender<Vec<usize>>>,
    batches: Receiver<Gathered>,
    /// Requested and not yet taken.
    in_flight: Option<Vec<usize>>,
    worker: Option<JoinHandle<()>>,
}

impl Prefetcher {
    /// A helper thread gathering rows of `x` and `y` (shared, not copied).
    pub fn start(x: &Tensor, y: &Tensor) -> std::io::Result<Prefetcher> {
        let (x, y) = (x.shallow_clone(), y.shallow_clone());
        let (req_tx, req_rx) = channel::<Vec<usize>>();
        let (out_tx, out_rx) = channel::<Gathered>();
        let worker = std::thread::Builder::new()
            .name("ht-prefetch".into())
            .spawn(move || {
                idle_priority();
                let _no_grad = tch::no_grad_guard();
                for idx in req_rx {
                    let (bx, by) = super::gather(&x, &y, &idx, Device::Cpu);
                    if out_tx.send(Gathered { idx, x: bx, y: by }).is_err() {
                        break;
                    }
                }
            })?;
        Ok(Prefetcher {
            requests: Some(req_tx),
            batches: out_rx,
            in_flight: None,
            worker: Some(worker),
        })
    }

    /// Start gathering the rows `idx` for a later [`Prefetcher::take`].
    /// One request at a time: while one is in flight, this does nothing.
    pub fn request(&mut self, idx: Vec<usize>) {
        if self.in_flight.is_some() {
            return;
        }
        if let Some(tx) = &self.requests {
            if tx.send(idx.clone()).is_ok() {
                self.in_flight = Some(idx);
            }
        }
    }

    /// The batch gathered for `idx` (on the CPU), waiting for it if the
    /// helper is still at it; `None` when no request is in flight or the
    /// one in flight was for other indices (that batch is dropped).
    pub fn take(&mut self, idx: &[usize]) -> Option<(Tensor, Tensor)> {
        self.in_flight.take()?;
        let got = self.batches.recv().ok()?;
        (got.idx == idx).then_some((got.x, got.y))
    }
}

impl Drop for Prefetcher {
    fn drop(&mut self) {
        // Closing the request channel ends the helper's loop.
        self.requests = None;
        if let Some(w) = self.worker.take() {
            let _ = w.join();
        }
    }
}

/// This thread runs only when its CPU has nothing else to run (Linux);
/// elsewhere, or if the kernel refuses, it keeps its normal priority.
fn idle_priority() {
    #[cfg(target_os = "linux")]
    {
        let param = libc::sched_param { sched_priority: 0 };
        // SAFETY: `param` is a valid sched_param for the call's duration;
        // pid 0 is the calling thread.
        let _ = unsafe { libc::sched_setscheduler(0, libc::SCHED_IDLE, &param) };
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use tch::Kind;

    fn data() -> (Tensor, Tensor) {
        let x = Tensor::arange(40, (Kind::Float, Device::Cpu)).view([10, 4]);
        let y = Tensor::arange(10, (Kind::Int64, Device::Cpu));
        (x, y)
    }

    #[test]
    fn a_requested_batch_is_the_gathered_rows() {
        let (x, y) = data();
        let mut p = Prefetcher::start(&x, &y).unwrap();
        p.request(vec![7, 2, 5]);
        let (bx, by) = p.take(&[7, 2, 5]).expect("the requested batch");
        let (ex, ey) = super::super::gather(&x, &y, &[7, 2, 5], Device::Cpu);
        assert!(bx.equal(&ex));
        assert!(by.equal(&ey));
        // Taken: nothing is left in flight.
        assert!(p.take(&[7, 2, 5]).is_none());
    }

    #[test]
    fn a_batch_for_other_indices_is_not_handed_out() {
        let (x, y) = data();
        let mut p = Prefetcher::start(&x, &y).unwrap();
        p.request(vec![1, 2]);
        assert!(p.take(&[1, 3]).is_none());
        // The stale batch was dropped: the next request is answered alone.
        p.request(vec![4]);
        let (_, by) = p.take(&[4]).expect("the new batch");
        assert_eq!(by.int64_value(&[0]), 4);
    }

    #[test]
    fn a_second_request_waits_for_the_first_to_be_taken() {
        let (x, y) = data();
        let mut p = Prefetcher::start(&x, &y).unwrap();
        p.request(vec![0]);
        p.request(vec![9]);
        assert!(p.take(&[9]).is_none());
        assert!(p.take(&[0]).is_none());
    }
}
