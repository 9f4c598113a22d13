//! PyTorch's `c10d::Reducer` driven from Rust.

use super::ffi::*;
use super::*;

/// A `c10d::Reducer` bound to its group (see [`ProcessGroup::reducer`]).
pub struct Reducer<'a> {
    pub(super) pg: &'a ProcessGroup,
    pub(super) handle: *mut c_void,
}

/// How one backward's bucket all-reduces were launched.
#[derive(Clone, Debug, PartialEq)]
pub struct ReducerTrace {
    /// For each bucket launch, in order: gradients ready at that moment.
    pub ready_at_launch: Vec<i64>,
    /// Parameters the Reducer covers.
    pub params: i64,
    /// Seconds from arming to the last gradient being ready (the local
    /// backward, including waits inside it such as synchronised BatchNorm).
    pub backward_seconds: f64,
}

impl ReducerTrace {
    /// Buckets whose all-reduce started while backward still had gradients
    /// to produce (communication overlapped with computation). A launch is
    /// recorded before the gradient that completed its bucket is counted,
    /// so the launch at the very end of backward saw `params − 1`.
    pub fn overlapped_launches(&self) -> usize {
        self.ready_at_launch
            .iter()
            .filter(|&&r| r + 1 < self.params)
            .count()
    }
}

impl Reducer<'_> {
    /// Call before every forward (rebuilds buckets after the first step).
    pub fn prepare_forward(&self) -> Result<()> {
        let r = self.handle;
        // SAFETY: r is a live Reducer.
        self.pg.call("reducer", |err| unsafe {
            ht_reducer_prepare_forward(r, err, ERR_LEN)
        })
    }

    /// Call right before `loss.backward()`.
    pub fn prepare_backward(&self, loss: &Tensor) -> Result<()> {
        let r = self.handle;
        let mut l = loss.shallow_clone();
        let p = l.as_mut_ptr() as *mut c_void;
        // SAFETY: r is a live Reducer, p a live tensor.
        self.pg.call("reducer", |err| unsafe {
            ht_reducer_prepare_backward(r, p, err, ERR_LEN)
        })
    }

    /// Sum each gradient bucket only for the owners of its elements: group
    /// rank q owns elements `bounds[q]` of `flat`, the buffer every
    /// parameter is a view of. Each rank then holds the exact sum of the
    /// gradients it owns (and its local gradient elsewhere), for about half
    /// the bytes of an all-reduce. `None`: every rank gets the whole sum.
    pub fn set_shards(&self, shards: Option<(&Tensor, &[(i64, i64)])>) -> Result<()> {
        let r = self.handle;
        let (mut flat, bounds) = match shards {
            Some((flat, bounds)) => (Some(flat.shallow_clone()), bounds.to_vec()),
            None => (None, Vec::new()),
        };
        let words: Vec<i64> = bounds.iter().flat_map(|&(lo, hi)| [lo, hi]).collect();
        let fp = flat
            .as_mut()
            .map_or(std::ptr::null_mut(), |t| t.as_mut_ptr() as *mut c_void);
        // SAFETY: r is a live Reducer; fp a live tensor or null; words
        // holds 2·len(bounds) entries.
        self.pg.call("reducer", |err| unsafe {
            ht_reducer_set_shards(r, fp, words.as_ptr(), bounds.len(), err, ERR_LEN)
        })
    }

    /// The last backward's bucket launches.
    pub fn trace(&self) -> ReducerTrace {
        let mut buf = vec![0i64; 4096];
        let mut params = 0i64;
        let mut compute_ns = 0i64;
        // SAFETY: buf holds cap entries; r is live.
        let n = unsafe {
            ht_reducer_trace(
                self.handle,
                buf.as_mut_ptr(),
                buf.len() as i64,
                &mut params,
                &mut compute_ns,
            )
        };
        buf.truncate((n.max(0) as usize).min(4096));
        ReducerTrace {
            ready_at_launch: buf,
            params,
            backward_seconds: compute_ns.max(0) as f64 * 1e-9,
        }
    }
}

impl Drop for Reducer<'_> {
    fn drop(&mut self) {
        // SAFETY: handle came from ht_reducer_create and is dropped once.
        unsafe { ht_reducer_destroy(self.handle) }
    }
}
