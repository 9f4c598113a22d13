//! Safe Rust wrapper over the C++ c10d shim (csrc/): a
//! `ProcessGroup` joined through PyTorch's TCPStore, with Gloo (and NCCL
//! when built with the `nccl` feature) collectives on tch tensors.

use std::ffi::{c_char, c_int, c_void, CString};

use std::time::Duration;

use tch::{Device, Tensor};

use crate::error::{Result, TrainerError};

mod ffi;
mod reducer;
mod slot;

use ffi::*;
pub use reducer::{Reducer, ReducerTrace, UpdateDone, UpdateInBackward};
pub use slot::{autograd_collective_seconds, GroupSlot, SlotBinding};

/// Turn ATen's deterministic-algorithms switch on or off.
pub fn set_deterministic(on: bool) {
    // SAFETY: plain setter on ATen's global context; catches internally.
    unsafe { ht_set_deterministic(c_int::from(on)) }
}

/// The SGD update of one range in one pass (csrc/update_kernel.cpp; `c` =
/// weight decay, momentum, −lr) over `p`, `g`, `m`, element by element
/// through the same float ops, in the same order, as the whole-tensor ops
/// of `Optimizer::update_ops`: the same bits in a quarter of the memory
/// traffic. Ok(false): tensors that are not contiguous float32 on the CPU
/// (or not three coefficients); nothing was touched (run the tensor ops
/// instead).
pub fn fused_sgd(p: &Tensor, g: &Tensor, m: &Tensor, c: &[f64]) -> Result<bool> {
    let (mut p, mut g, mut m) = (p.shallow_clone(), g.shallow_clone(), m.shallow_clone());
    let mut applied: c_int = 0;
    let mut buf = [0 as c_char; ERR_LEN];
    // SAFETY: p, g and m are live tensors for the call; c holds c.len()
    // values; the shim checks lengths, kinds and devices and catches every
    // C++ exception.
    let rc = unsafe {
        ht_sgd_fused(
            p.as_mut_ptr() as *mut c_void,
            g.as_mut_ptr() as *mut c_void,
            m.as_mut_ptr() as *mut c_void,
            c.as_ptr(),
            c.len(),
            &mut applied,
            buf.as_mut_ptr(),
            ERR_LEN,
        )
    };
    if rc != 0 {
        return Err(TrainerError::Collective {
            op: "update",
            msg: err_text(&buf),
        });
    }
    Ok(applied != 0)
}

/// Drop the gradients of `params` (PyTorch's `p.grad = None`). The next
/// backward then hands each gradient over as computed: with a Reducer it is
/// copied into its bucket once (and `.grad()` points into the bucket again),
/// where zeroing in place costs a fill and an add over every gradient.
pub fn clear_grads(params: &[Tensor]) {
    let mut ptrs: Vec<*mut c_void> = params.iter().map(|p| p.as_ptr() as *mut c_void).collect();
    // SAFETY: every pointer is a live tensor borrowed for the call; the
    // shim only resets each one's gradient slot.
    unsafe { ht_clear_grads(ptrs.as_mut_ptr(), ptrs.len()) }
}

/// Quiet c10d's own stderr logging (its errors reach us as exceptions)
/// unless the user set `TORCH_CPP_LOG_LEVEL`.
pub fn quiet_c10_logging() {
    if std::env::var_os("TORCH_CPP_LOG_LEVEL").is_none() {
        // SAFETY: writes an int flag.
        unsafe { ht_set_log_level(3) }
    }
}

/// How to join the job.
#[derive(Clone, Debug)]
pub struct RendezvousConfig {
    pub master_addr: String,
    pub master_port: u16,
    pub rank: usize,
    pub world_size: usize,
    pub rendezvous_timeout: Duration,
    pub collective_timeout: Duration,
    /// Address the Gloo device binds (None: the interface / default rules).
    pub bind_host: Option<String>,
    /// Network interface for Gloo (GLOO_SOCKET_IFNAME).
    pub iface: Option<String>,
}

/// A joined c10d process group.
pub struct ProcessGroup {
    handle: *mut c_void,
    rank: usize,
    world: usize,
    nccl: bool,
}

// SAFETY: the C++ group is used from one thread at a time (&mut / owned).
unsafe impl Send for ProcessGroup {}

/// An in-flight asynchronous collective; `wait` it before using the tensor.
pub struct PendingWork<'a> {
    pg: &'a ProcessGroup,
    work: *mut c_void,
    op: &'static str,
}

impl PendingWork<'_> {
    /// Block until the collective finished (or failed / timed out).
    pub fn wait(mut self) -> Result<()> {
        let work = std::mem::replace(&mut self.work, std::ptr::null_mut());
        let op = self.op;
        self.pg.call(op, |err| unsafe {
            ht_work_wait(self.pg.handle, work, err, ERR_LEN)
        })
    }
}

impl Drop for PendingWork<'_> {
    fn drop(&mut self) {
        if !self.work.is_null() {
            let mut buf = vec![0 as c_char; ERR_LEN];
            // SAFETY: work came from ht_pg_allreduce_sum_async and is waited once.
            unsafe { ht_work_wait(self.pg.handle, self.work, buf.as_mut_ptr(), ERR_LEN) };
        }
    }
}

fn err_text(buf: &[c_char]) -> String {
    let bytes: Vec<u8> = buf
        .iter()
        .take_while(|&&c| c != 0)
        .map(|&c| c as u8)
        .collect();
    String::from_utf8_lossy(&bytes).into_owned()
}

fn is_loopback(addr: &str) -> bool {
    addr == "localhost" || addr.starts_with("127.") || addr == "::1"
}

impl ProcessGroup {
    /// Rendezvous at `MASTER_ADDR:MASTER_PORT` and build the process groups.
    /// A rank that does not arrive within the rendezvous timeout is named in
    /// the error.
    pub fn join(cfg: &RendezvousConfig) -> Result<ProcessGroup> {
        let bad = |what: &str| TrainerError::Config(format!("{what} contains a NUL byte"));
        let addr = CString::new(cfg.master_addr.clone()).map_err(|_| bad("MASTER_ADDR"))?;
        let bind = cfg.bind_host.clone().or_else(|| {
            if cfg.iface.is_none() && is_loopback(&cfg.master_addr) {
                Some("127.0.0.1".to_string())
            } else {
                None
            }
        });
        let bind = CString::new(bind.unwrap_or_default()).map_err(|_| bad("bind host"))?;
        let iface =
            CString::new(cfg.iface.clone().unwrap_or_default()).map_err(|_| bad("interface"))?;
        let mut handle: *mut c_void = std::ptr::null_mut();
        let mut buf = vec![0 as c_char; ERR_LEN];
        // SAFETY: all pointers are valid for the duration of the call.
        let rc = unsafe {
            ht_pg_create(
                addr.as_ptr(),
                c_int::from(cfg.master_port),
                cfg.rank as c_int,
                cfg.world_size as c_int,
                cfg.rendezvous_timeout.as_millis() as i64,
                cfg.collective_timeout.as_millis() as i64,
                bind.as_ptr(),
                iface.as_ptr(),
                0,
                2,
                &mut handle,
                buf.as_mut_ptr(),
                ERR_LEN,
            )
        };
        if rc != 0 || handle.is_null() {
            return Err(TrainerError::Rendezvous(err_text(&buf)));
        }
        // SAFETY: handle is a live group.
        let nccl = unsafe { ht_pg_has_nccl(handle) } != 0;
        Ok(ProcessGroup {
            handle,
            rank: cfg.rank,
            world: cfg.world_size,
            nccl,
        })
    }

    pub fn rank(&self) -> usize {
        self.rank
    }

    /// A group of the ranks in `members` (ascending, this rank among them),
    /// over the same rendezvous: every member calls it at the same point,
    /// the other ranks do not. Its ranks are positions in `members`.
    pub fn subgroup(&self, members: &[usize]) -> Result<ProcessGroup> {
        if !members.contains(&self.rank) || members.windows(2).any(|w| w[0] >= w[1]) {
            return Err(TrainerError::Collective {
                op: "subgroup",
                msg: format!(
                    "rank {} cannot build a group of ranks {members:?} (ascending, itself among them)",
                    self.rank
                ),
            });
        }
        let ids: Vec<c_int> = members.iter().map(|&r| r as c_int).collect();
        let tag = members
            .iter()
            .map(usize::to_string)
            .collect::<Vec<_>>()
            .join(".");
        let tag = CString::new(tag).unwrap_or_default();
        let mut handle: *mut c_void = std::ptr::null_mut();
        let h = self.handle;
        // SAFETY: ids and tag outlive the call; handle receives a new group.
        self.call("subgroup", |err| unsafe {
            ht_pg_subgroup(
                h,
                ids.as_ptr(),
                ids.len() as c_int,
                tag.as_ptr(),
                &mut handle,
                err,
                ERR_LEN,
            )
        })?;
        // SAFETY: handle is a live group.
        let nccl = unsafe { ht_pg_has_nccl(handle) } != 0;
        Ok(ProcessGroup {
            handle,
            rank: members.iter().position(|&r| r == self.rank).unwrap_or(0),
            world: members.len(),
            nccl,
        })
    }

    pub fn world_size(&self) -> usize {
        self.world
    }

    /// Build the NCCL group (every rank together, all on CUDA).
    pub fn enable_nccl(&mut self) -> Result<()> {
        let h = self.handle;
        // SAFETY: h is live.
        self.call("enable_nccl", |err| unsafe {
            ht_pg_enable_nccl(h, err, ERR_LEN)
        })?;
        // SAFETY: h is live.
        self.nccl = unsafe { ht_pg_has_nccl(h) } != 0;
        Ok(())
    }

    /// True when `t` must be copied through host memory for a collective.
    pub fn needs_staging(&self, t: &Tensor) -> bool {
        !self.direct(t)
    }

    /// Whether CUDA tensors go through NCCL (else they are staged via host).
    pub fn has_nccl(&self) -> bool {
        self.nccl
    }

    fn call(&self, op: &'static str, f: impl FnOnce(*mut c_char) -> c_int) -> Result<()> {
        let mut buf = vec![0 as c_char; ERR_LEN];
        if f(buf.as_mut_ptr()) != 0 {
            return Err(TrainerError::Collective {
                op,
                msg: err_text(&buf),
            });
        }
        Ok(())
    }

    fn check(t: &Tensor) -> Result<()> {
        if !t.is_contiguous() {
            return Err(TrainerError::Collective {
                op: "check",
                msg: "tensor is not contiguous".into(),
            });
        }
        Ok(())
    }

    /// Whether `t` can go to c10d as is (CPU, or CUDA with NCCL).
    fn direct(&self, t: &Tensor) -> bool {
        t.device() == Device::Cpu || self.nccl
    }

    /// In-place SUM all-reduce.
    pub fn all_reduce_sum(&self, t: &mut Tensor) -> Result<()> {
        Self::check(t)?;
        if !self.direct(t) {
            let mut host = t.to_device(Device::Cpu);
            self.all_reduce_sum(&mut host)?;
            t.copy_(&host);
            return Ok(());
        }
        let h = self.handle;
        let p = t.as_mut_ptr() as *mut c_void;
        // SAFETY: p is a live at::Tensor*, h a live group.
        self.call("all_reduce", |err| unsafe {
            ht_pg_allreduce_sum(h, p, err, ERR_LEN)
        })
    }

    /// Start an in-place SUM all-reduce of a CPU (or NCCL-able) tensor; the
    /// tensor must stay alive and untouched until the work is waited.
    pub fn all_reduce_sum_async(&self, t: &mut Tensor) -> Result<PendingWork<'_>> {
        let h = self.handle;
        // SAFETY: `start` hands a live at::Tensor* and a slot for the work.
        self.start("all_reduce", t, |p, work, err| unsafe {
            ht_pg_allreduce_sum_async(h, p, work, err, ERR_LEN)
        })
    }

    /// Start an in-place SUM of a small contiguous CPU tensor over every
    /// rank through rank 0 (each rank sends it to rank 0, which adds them
    /// in rank order and sends the sum back): two messages on every rank
    /// but rank 0, where Gloo's ring all-reduce takes 2 (n − 1) each way.
    /// The tensor must stay alive and untouched until the work is waited;
    /// every rank starts its star sums in the same order.
    pub fn star_sum_async(&self, t: &mut Tensor) -> Result<PendingWork<'_>> {
        let h = self.handle;
        // SAFETY: `start` hands a live at::Tensor* and a slot for the work.
        self.start("star_sum", t, |p, work, err| unsafe {
            ht_pg_star_sum_async(h, p, work, err, ERR_LEN)
        })
    }

    /// Start the asynchronous collective `f` on `t` (a CPU or NCCL-able
    /// tensor, which must stay alive and untouched until the work is waited):
    /// `f` gets the tensor, the slot for the work's heap handle and the
    /// error buffer.
    fn start(
        &self,
        op: &'static str,
        t: &mut Tensor,
        f: impl FnOnce(*mut c_void, *mut *mut c_void, *mut c_char) -> c_int,
    ) -> Result<PendingWork<'_>> {
        Self::check(t)?;
        if !self.direct(t) {
            return Err(TrainerError::Collective {
                op,
                msg: "an asynchronous collective needs a host tensor when NCCL is off".into(),
            });
        }
        let p = t.as_mut_ptr() as *mut c_void;
        let mut work: *mut c_void = std::ptr::null_mut();
        self.call(op, |err| f(p, &mut work, err))?;
        Ok(PendingWork { pg: self, work, op })
    }

    /// In-place broadcast from `root`.
    pub fn broadcast(&self, t: &mut Tensor, root: usize) -> Result<()> {
        Self::check(t)?;
        if !self.direct(t) {
            let mut host = t.to_device(Device::Cpu);
            self.broadcast(&mut host, root)?;
            t.copy_(&host);
            return Ok(());
        }
        let h = self.handle;
        let p = t.as_mut_ptr() as *mut c_void;
        // SAFETY: p is a live at::Tensor*.
        self.call("broadcast", |err| unsafe {
            ht_pg_broadcast(h, p, root as c_int, err, ERR_LEN)
        })
    }

    /// Start an in-place broadcast from `root` of a CPU (or NCCL-able)
    /// tensor; it must stay alive and untouched until the work is waited.
    pub fn broadcast_async(&self, t: &mut Tensor, root: usize) -> Result<PendingWork<'_>> {
        let h = self.handle;
        // SAFETY: `start` hands a live at::Tensor* and a slot for the work.
        self.start("broadcast", t, |p, work, err| unsafe {
            ht_pg_broadcast_async(h, p, root as c_int, work, err, ERR_LEN)
        })
    }

    /// Start sending `t` (a CPU or NCCL-able tensor, untouched until the
    /// work is waited) to rank `peer`; the receiver posts a receive with
    /// the same `tag`.
    pub fn send_async(&self, t: &mut Tensor, peer: usize, tag: i32) -> Result<PendingWork<'_>> {
        let h = self.handle;
        // SAFETY: `start` hands a live at::Tensor* and a slot for the work.
        self.start("send", t, |p, work, err| unsafe {
            ht_pg_send_async(h, p, peer as c_int, tag as c_int, work, err, ERR_LEN)
        })
    }

    /// Start receiving into `t` from rank `peer` (see [`Self::send_async`]).
    pub fn recv_async(&self, t: &mut Tensor, peer: usize, tag: i32) -> Result<PendingWork<'_>> {
        let h = self.handle;
        // SAFETY: `start` hands a live at::Tensor* and a slot for the work.
        self.start("recv", t, |p, work, err| unsafe {
            ht_pg_recv_async(h, p, peer as c_int, tag as c_int, work, err, ERR_LEN)
        })
    }

    /// Gather `t` from every rank; returns one tensor per rank.
    pub fn all_gather(&self, t: &Tensor) -> Result<Vec<Tensor>> {
        let mut input = t.to_device(Device::Cpu).contiguous();
        let mut outs: Vec<Tensor> = (0..self.world).map(|_| input.empty_like()).collect();
        let mut ptrs: Vec<*mut c_void> = outs
            .iter_mut()
            .map(|o| o.as_mut_ptr() as *mut c_void)
            .collect();
        let h = self.handle;
        let p = input.as_mut_ptr() as *mut c_void;
        // SAFETY: input and outs outlive the call.
        self.call("all_gather", |err| unsafe {
            ht_pg_allgather(h, p, ptrs.as_mut_ptr(), err, ERR_LEN)
        })?;
        Ok(outs)
    }

    /// PyTorch's DDP engine (`c10d::Reducer`) over `params`: during each
    /// backward armed with [`Reducer::prepare_backward`], gradient buckets
    /// (`first_bucket_bytes`, then about `bucket_bytes` each) are
    /// SUM-all-reduced asynchronously as their gradients become ready, and
    /// the reduced gradients are in place when backward returns. Gradients
    /// become views into the bucket buffers.
    pub fn reducer(
        &self,
        params: &[Tensor],
        bucket_bytes: usize,
        first_bucket_bytes: usize,
    ) -> Result<Reducer<'_>> {
        let mut owned: Vec<Tensor> = params.iter().map(Tensor::shallow_clone).collect();
        let mut ptrs: Vec<*mut c_void> = owned
            .iter_mut()
            .map(|t| t.as_mut_ptr() as *mut c_void)
            .collect();
        let mut handle: *mut c_void = std::ptr::null_mut();
        let h = self.handle;
        // SAFETY: the tensors outlive the call; handle receives a new Reducer.
        self.call("reducer", |err| unsafe {
            ht_reducer_create(
                h,
                ptrs.as_mut_ptr(),
                ptrs.len(),
                bucket_bytes as i64,
                first_bucket_bytes as i64,
                &mut handle,
                err,
                ERR_LEN,
            )
        })?;
        Ok(Reducer { pg: self, handle })
    }

    /// Wait for every rank.
    pub fn barrier(&self) -> Result<()> {
        let h = self.handle;
        // SAFETY: h is live.
        self.call("barrier", |err| unsafe { ht_pg_barrier(h, err, ERR_LEN) })
    }
}

impl Drop for ProcessGroup {
    fn drop(&mut self) {
        // SAFETY: handle came from ht_pg_create and is dropped once.
        unsafe { ht_pg_destroy(self.handle) }
    }
}
