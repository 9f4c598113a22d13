//! The next step's batch gathered ahead of time, on a helper thread at idle
//! CPU priority (Linux `SCHED_IDLE`): it runs when a core would otherwise
//! wait, in the gradient exchange after backward or for a slower rank, so
//! gathering rows leaves the step's own path. A batch is handed out only
//! for exactly the indices it was gathered for, so the data a step trains
//! on never depends on whether its batch came from here.

use std::sync::mpsc::{channel, Receiver, Sender, TryRecvError};
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

use tch::{Device, Tensor};

/// One gathered batch and the number of the request it answers.
struct Gathered {
    seq: u64,
    x: Tensor,
    y: Tensor,
}

/// Requests not yet answered, beyond which no new one is sent: the helper
/// is behind (its CPU never idles), and each step gathers its own batch.
const MAX_OUTSTANDING: usize = 2;

/// The helper thread and the requests it has been sent.
pub struct Prefetcher {
    requests: Option<Sender<(u64, Vec<usize>)>>,
    batches: Receiver<Gathered>,
    /// The newest request (number, indices), until taken.
    wanted: Option<(u64, Vec<usize>)>,
    next_seq: u64,
    /// Requests sent and not yet answered.
    outstanding: usize,
    worker: Option<JoinHandle<()>>,
}

impl Prefetcher {
    /// A helper thread gathering rows of `x` and `y` (shared, not copied),
    /// at idle CPU priority unless `normal_priority` (for a step that waits
    /// on it: an idle-priority helper may starve on a loaded machine).
    pub fn start(x: &Tensor, y: &Tensor, normal_priority: bool) -> std::io::Result<Prefetcher> {
        let (x, y) = (x.shallow_clone(), y.shallow_clone());
        let (req_tx, req_rx) = channel::<(u64, Vec<usize>)>();
        let (out_tx, out_rx) = channel::<Gathered>();
        let worker = std::thread::Builder::new()
            .name("ht-prefetch".into())
            .spawn(move || {
                if !normal_priority {
                    idle_priority();
                }
                let _no_grad = tch::no_grad_guard();
                for (seq, idx) in req_rx {
                    let (bx, by) = super::gather(&x, &y, &idx, Device::Cpu);
                    let out = Gathered { seq, x: bx, y: by };
                    if out_tx.send(out).is_err() {
                        break;
                    }
                }
            })?;
        Ok(Prefetcher {
            requests: Some(req_tx),
            batches: out_rx,
            wanted: None,
            next_seq: 0,
            outstanding: 0,
            worker: Some(worker),
        })
    }

    /// Start gathering the rows `idx` for a later [`Prefetcher::take`]; an
    /// earlier request not taken is abandoned. Nothing is sent while the
    /// helper is [`MAX_OUTSTANDING`] requests behind.
    pub fn request(&mut self, idx: Vec<usize>) {
        while self.next_ready(None).is_some() {}
        if self.outstanding >= MAX_OUTSTANDING {
            self.wanted = None;
            return;
        }
        let seq = self.next_seq;
        if let Some(tx) = &self.requests {
            if tx.send((seq, idx.clone())).is_ok() {
                self.next_seq += 1;
                self.outstanding += 1;
                self.wanted = Some((seq, idx));
            }
        }
    }

    /// The batch gathered for `idx` (on the CPU) if the helper has it
    /// within `patience`; `None` when there is no request, it is for
    /// other indices, or it is not done in time (a helper at idle
    /// priority on a busy CPU may take long: the step then gathers its
    /// own rows rather than wait; the late batch is dropped).
    pub fn take(&mut self, idx: &[usize], patience: Duration) -> Option<(Tensor, Tensor)> {
        let (seq, want) = self.wanted.take()?;
        let deadline = Instant::now() + patience;
        loop {
            let got = self.next_ready(Some(deadline))?;
            if got.seq == seq {
                return (want == idx).then_some((got.x, got.y));
            }
        }
    }

    /// The next answer: one already there (`until` None), or one that
    /// comes by `until`.
    fn next_ready(&mut self, until: Option<Instant>) -> Option<Gathered> {
        let got = match self.batches.try_recv() {
            Ok(g) => Some(g),
            Err(TryRecvError::Disconnected) => None,
            Err(TryRecvError::Empty) => {
                let left = until?.saturating_duration_since(Instant::now());
                self.batches.recv_timeout(left).ok()
            }
        }?;
        self.outstanding = self.outstanding.saturating_sub(1);
        Some(got)
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

    const WAIT: Duration = Duration::from_secs(30);

    fn data() -> (Tensor, Tensor) {
        let x = Tensor::arange(40, (Kind::Float, Device::Cpu)).view([10, 4]);
        let y = Tensor::arange(10, (Kind::Int64, Device::Cpu));
        (x, y)
    }

    #[test]
    fn a_requested_batch_is_the_gathered_rows() {
        let (x, y) = data();
        let mut p = Prefetcher::start(&x, &y, true).unwrap();
        p.request(vec![7, 2, 5]);
        let (bx, by) = p.take(&[7, 2, 5], WAIT).expect("the requested batch");
        let (ex, ey) = super::super::gather(&x, &y, &[7, 2, 5], Device::Cpu);
        assert!(bx.equal(&ex));
        assert!(by.equal(&ey));
        // Taken: nothing is left to take.
        assert!(p.take(&[7, 2, 5], WAIT).is_none());
    }

    #[test]
    fn a_batch_for_other_indices_is_not_handed_out() {
        let (x, y) = data();
        let mut p = Prefetcher::start(&x, &y, true).unwrap();
        p.request(vec![1, 2]);
        assert!(p.take(&[1, 3], WAIT).is_none());
        p.request(vec![4]);
        let (_, by) = p.take(&[4], WAIT).expect("the new batch");
        assert_eq!(by.int64_value(&[0]), 4);
    }

    #[test]
    fn an_abandoned_request_is_skipped() {
        let (x, y) = data();
        let mut p = Prefetcher::start(&x, &y, true).unwrap();
        p.request(vec![0]);
        p.request(vec![9]);
        // The answer for [0] comes first and is dropped.
        let (_, by) = p.take(&[9], WAIT).expect("the newest request's batch");
        assert_eq!(by.int64_value(&[0]), 9);
        assert_eq!(p.outstanding, 0);
    }

    #[test]
    fn a_helper_that_falls_behind_gets_no_more_requests_until_it_answers() {
        let (x, y) = data();
        let mut p = Prefetcher::start(&x, &y, true).unwrap();
        // Not taken in time (no patience): the step gathers its own.
        for i in 0..5 {
            p.request(vec![i]);
            let _ = p.take(&[i], Duration::ZERO);
            assert!(p.outstanding <= MAX_OUTSTANDING, "{}", p.outstanding);
        }
        // Once the helper has answered, requests flow again.
        while p.outstanding > 0 {
            assert!(
                p.next_ready(Some(Instant::now() + WAIT)).is_some(),
                "the helper answers"
            );
        }
        p.request(vec![6]);
        let (_, by) = p.take(&[6], WAIT).expect("a batch after the backlog");
        assert_eq!(by.int64_value(&[0]), 6);
    }
}
