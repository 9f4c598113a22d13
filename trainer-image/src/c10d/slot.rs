//! Collectives inside forward and backward (synchronised BatchNorm).

use std::sync::{Arc, Mutex};

use tch::Tensor;

use super::ffi::*;
use super::*;

/// A late-bound link from modules (built before the group exists) to the
/// process group, for collectives inside forward and backward
/// (synchronised BatchNorm). Unbound — a single process — means "no group".
#[derive(Clone, Debug, Default)]
pub struct GroupSlot {
    inner: Arc<Mutex<SlotState>>,
}

#[derive(Debug, Default)]
struct SlotState {
    /// The live group's handle as an address (0: unbound).
    handle: usize,
    /// The first collective failure seen inside forward, for the caller.
    error: Option<String>,
}

/// Keeps a [`GroupSlot`] bound to a group; unbinds when dropped.
pub struct SlotBinding<'a> {
    slot: GroupSlot,
    _pg: std::marker::PhantomData<&'a ProcessGroup>,
}

impl Drop for SlotBinding<'_> {
    fn drop(&mut self) {
        if let Ok(mut s) = self.slot.inner.lock() {
            s.handle = 0;
        }
    }
}

impl GroupSlot {
    /// Bind to `pg` for as long as the returned binding lives.
    pub fn bind<'a>(&self, pg: &'a ProcessGroup) -> SlotBinding<'a> {
        if let Ok(mut s) = self.inner.lock() {
            s.handle = pg.handle as usize;
            s.error = None;
        }
        SlotBinding {
            slot: self.clone(),
            _pg: std::marker::PhantomData,
        }
    }

    /// Whether a group is bound (more than one process).
    pub fn is_bound(&self) -> bool {
        self.inner.lock().map(|s| s.handle != 0).unwrap_or(false)
    }

    /// SUM of `x` over ranks, differentiable: the backward pass SUMs the
    /// incoming gradient over ranks too, so every rank must run the same
    /// forward and backward sequence. `None` when unbound. A failed
    /// collective is recorded (see [`GroupSlot::take_error`]) and yields NaN.
    pub fn all_reduce_sum_autograd(&self, x: &Tensor) -> Option<Tensor> {
        let mut s = self.inner.lock().ok()?;
        if s.handle == 0 {
            return None;
        }
        let mut input = x.shallow_clone();
        let mut out: *mut c_void = std::ptr::null_mut();
        let mut buf = vec![0 as c_char; ERR_LEN];
        // SAFETY: the handle is live while bound (SlotBinding borrows the
        // group); input is a live at::Tensor*; out receives a new one we own.
        let rc = unsafe {
            ht_allreduce_sum_autograd(
                s.handle as *mut c_void,
                input.as_mut_ptr() as *mut c_void,
                &mut out,
                buf.as_mut_ptr(),
                ERR_LEN,
            )
        };
        if rc != 0 || out.is_null() {
            if s.error.is_none() {
                s.error = Some(err_text(&buf));
            }
            return Some(x.detach().full_like(f64::NAN));
        }
        // SAFETY: out is a heap at::Tensor* whose ownership passes to tch.
        Some(unsafe { Tensor::from_ptr(out as *mut _) })
    }

    /// The first collective error recorded since the last call.
    pub fn take_error(&self) -> Option<String> {
        self.inner.lock().ok().and_then(|mut s| s.error.take())
    }
}

/// Seconds spent so far inside differentiable all-reduces (synchronised
/// BatchNorm), waiting for other ranks included; diff two readings.
pub fn autograd_collective_seconds() -> f64 {
    // SAFETY: reads an atomic counter.
    unsafe { ht_autograd_collective_ns() as f64 * 1e-9 }
}
