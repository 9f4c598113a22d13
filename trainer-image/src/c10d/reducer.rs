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

/// The optimizer state and coefficients for an update run inside backward
/// (see [`Reducer::set_update`]).
pub struct UpdateInBackward<'t> {
    pub adamw: bool,
    /// This rank's state over its range `own` of the flat buffer.
    pub m: &'t Tensor,
    pub v: Option<&'t Tensor>,
    pub own: (i64, i64),
    /// The step's coefficients ([`crate::optim::Optimizer::coefficients`]).
    pub coefficients: Vec<f64>,
}

/// What the last backward's in-backward update did.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct UpdateDone {
    /// Elements this rank updated.
    pub updated: i64,
    /// Elements received, already updated, from their owners.
    pub received: i64,
    /// Pieces updated while backward still had gradients to produce.
    pub early: i64,
    /// Seconds spent updating (on the comm hook's threads).
    pub seconds: f64,
}

impl Reducer<'_> {
    /// Run the next backward's optimizer update inside it (needs shards,
    /// [`Reducer::set_shards`], on the CPU): each owner updates a piece
    /// of a bucket as soon as its sums arrive and sends the new values to
    /// the other ranks. `None` turns it off. Call before every backward.
    pub fn set_update(&self, update: Option<UpdateInBackward<'_>>) -> Result<()> {
        let r = self.handle;
        let Some(u) = update else {
            // SAFETY: r is a live Reducer; off needs no pointers.
            return self.pg.call("reducer", |err| unsafe {
                ht_reducer_set_update(
                    r,
                    0,
                    0,
                    std::ptr::null_mut(),
                    std::ptr::null_mut(),
                    0,
                    0,
                    std::ptr::null(),
                    0,
                    err,
                    ERR_LEN,
                )
            });
        };
        let mut m = u.m.shallow_clone();
        let mut v = u.v.map(Tensor::shallow_clone);
        let mp = m.as_mut_ptr() as *mut c_void;
        let vp = v
            .as_mut()
            .map_or(std::ptr::null_mut(), |t| t.as_mut_ptr() as *mut c_void);
        let c = u.coefficients;
        // SAFETY: r is a live Reducer; mp and vp live tensors (or null);
        // c holds c.len() values.
        self.pg.call("reducer", |err| unsafe {
            ht_reducer_set_update(
                r,
                1,
                c_int::from(u.adamw),
                mp,
                vp,
                u.own.0,
                u.own.1,
                c.as_ptr(),
                c.len(),
                err,
                ERR_LEN,
            )
        })
    }

    /// What the last backward's in-backward update did.
    pub fn updated(&self) -> UpdateDone {
        let (mut updated, mut received, mut early, mut ns) = (0i64, 0i64, 0i64, 0i64);
        // SAFETY: r is a live Reducer; the outputs are valid i64s.
        unsafe {
            ht_reducer_updated(
                self.handle,
                &mut updated,
                &mut received,
                &mut early,
                &mut ns,
            )
        };
        UpdateDone {
            updated,
            received,
            early,
            seconds: ns.max(0) as f64 * 1e-9,
        }
    }

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
