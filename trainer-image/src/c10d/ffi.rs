//! The C++ shim's functions (csrc/*.cpp).

use std::ffi::{c_char, c_int, c_void};

pub(super) const ERR_LEN: usize = 2048;

extern "C" {
    #[allow(clippy::too_many_arguments)]
    pub(super) fn ht_pg_create(
        master_addr: *const c_char,
        master_port: c_int,
        rank: c_int,
        world: c_int,
        rendezvous_timeout_ms: i64,
        collective_timeout_ms: i64,
        bind_host: *const c_char,
        iface: *const c_char,
        use_nccl: c_int,
        gloo_threads: c_int,
        out: *mut *mut c_void,
        err: *mut c_char,
        err_len: usize,
    ) -> c_int;
    pub(super) fn ht_pg_destroy(h: *mut c_void);
    pub(super) fn ht_sgd_fused(
        p: *mut c_void,
        g: *mut c_void,
        m: *mut c_void,
        c: *const f64,
        nc: usize,
        applied: *mut c_int,
        err: *mut c_char,
        len: usize,
    ) -> c_int;
    pub(super) fn ht_pg_subgroup(
        h: *mut c_void,
        members: *const c_int,
        n: c_int,
        tag: *const c_char,
        out: *mut *mut c_void,
        err: *mut c_char,
        len: usize,
    ) -> c_int;
    pub(super) fn ht_pg_has_nccl(h: *mut c_void) -> c_int;
    pub(super) fn ht_pg_enable_nccl(h: *mut c_void, err: *mut c_char, len: usize) -> c_int;
    pub(super) fn ht_pg_allreduce_sum(
        h: *mut c_void,
        t: *mut c_void,
        err: *mut c_char,
        len: usize,
    ) -> c_int;
    pub(super) fn ht_pg_allreduce_sum_async(
        h: *mut c_void,
        t: *mut c_void,
        work: *mut *mut c_void,
        err: *mut c_char,
        len: usize,
    ) -> c_int;
    pub(super) fn ht_pg_star_sum_async(
        h: *mut c_void,
        t: *mut c_void,
        work: *mut *mut c_void,
        err: *mut c_char,
        len: usize,
    ) -> c_int;
    pub(super) fn ht_work_wait(
        h: *mut c_void,
        work: *mut c_void,
        err: *mut c_char,
        len: usize,
    ) -> c_int;
    pub(super) fn ht_pg_broadcast(
        h: *mut c_void,
        t: *mut c_void,
        root: c_int,
        err: *mut c_char,
        len: usize,
    ) -> c_int;
    pub(super) fn ht_pg_broadcast_async(
        h: *mut c_void,
        t: *mut c_void,
        root: c_int,
        work: *mut *mut c_void,
        err: *mut c_char,
        len: usize,
    ) -> c_int;
    pub(super) fn ht_pg_send_async(
        h: *mut c_void,
        t: *mut c_void,
        peer: c_int,
        tag: c_int,
        work: *mut *mut c_void,
        err: *mut c_char,
        len: usize,
    ) -> c_int;
    pub(super) fn ht_pg_recv_async(
        h: *mut c_void,
        t: *mut c_void,
        peer: c_int,
        tag: c_int,
        work: *mut *mut c_void,
        err: *mut c_char,
        len: usize,
    ) -> c_int;
    pub(super) fn ht_pg_allgather(
        h: *mut c_void,
        t: *mut c_void,
        outs: *mut *mut c_void,
        err: *mut c_char,
        len: usize,
    ) -> c_int;
    pub(super) fn ht_pg_barrier(h: *mut c_void, err: *mut c_char, len: usize) -> c_int;
    pub(super) fn ht_clear_grads(params: *mut *mut c_void, n: usize);
    pub(super) fn ht_allreduce_sum_autograd(
        h: *mut c_void,
        x: *mut c_void,
        out: *mut *mut c_void,
        err: *mut c_char,
        len: usize,
    ) -> c_int;
    #[allow(clippy::too_many_arguments)]
    pub(super) fn ht_reducer_create(
        h: *mut c_void,
        params: *mut *mut c_void,
        n: usize,
        bucket_bytes: i64,
        first_bucket_bytes: i64,
        out: *mut *mut c_void,
        err: *mut c_char,
        len: usize,
    ) -> c_int;
    pub(super) fn ht_reducer_prepare_forward(r: *mut c_void, err: *mut c_char, len: usize)
        -> c_int;
    pub(super) fn ht_reducer_prepare_backward(
        r: *mut c_void,
        loss: *mut c_void,
        err: *mut c_char,
        len: usize,
    ) -> c_int;
    pub(super) fn ht_reducer_trace(
        r: *mut c_void,
        out: *mut i64,
        cap: i64,
        params: *mut i64,
        compute_ns: *mut i64,
    ) -> i64;
    pub(super) fn ht_reducer_set_shards(
        r: *mut c_void,
        flat: *mut c_void,
        bounds: *const i64,
        n: usize,
        err: *mut c_char,
        len: usize,
    ) -> c_int;
    #[allow(clippy::too_many_arguments)]
    pub(super) fn ht_reducer_set_update(
        r: *mut c_void,
        on: c_int,
        adamw: c_int,
        m: *mut c_void,
        v: *mut c_void,
        own_lo: i64,
        own_hi: i64,
        c: *const f64,
        n: usize,
        err: *mut c_char,
        len: usize,
    ) -> c_int;
    pub(super) fn ht_reducer_updated(
        r: *mut c_void,
        updated: *mut i64,
        received: *mut i64,
        early: *mut i64,
        update_ns: *mut i64,
    );
    pub(super) fn ht_autograd_collective_ns() -> i64;
    pub(super) fn ht_reducer_destroy(r: *mut c_void);
    pub(super) fn ht_set_deterministic(on: c_int);
    pub(super) fn ht_set_log_level(level: c_int);
}
