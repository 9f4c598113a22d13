// reducer_shim.cpp: PyTorch's c10d::Reducer behind the C ABI.
#include "shim.h"

#include <cstdint>
#include <vector>

using namespace ht;

// ---------------------------------------------------------------------------
// PyTorch's DDP engine, c10d::Reducer, driven from Rust: gradient buckets
// are SUM-all-reduced asynchronously as soon as their gradients are ready
// during backward (a small first bucket, then ~bucket_bytes), gradients are
// views into the bucket buffers, and the bucket order is rebuilt from the
// first backward's gradient order, as DDP does. The b_r / B weight is in
// the loss, so the comm hook is a plain SUM (no division by world size).
#include <torch/csrc/distributed/c10d/ProcessGroup.hpp>
#include <torch/csrc/distributed/c10d/comm.hpp>
#include <torch/csrc/distributed/c10d/reducer.hpp>
#include <torch/csrc/autograd/functions/accumulate_grad.h>
#include <torch/csrc/autograd/utils/lambda_post_hook.h>

#include <atomic>
#include <condition_variable>
#include <deque>
#include <functional>
#include <mutex>
#include <thread>

namespace {

// What the trainer's overlap test and metrics read: per backward, how many
// gradients were ready when each bucket's all-reduce was launched.
struct HtReducerTrace {
  std::atomic<int64_t> ready{0};
  std::atomic<int64_t> armed_ns{0};
  std::atomic<int64_t> last_ready_ns{0};
  std::mutex mu;
  std::vector<int64_t> ready_at_launch;
};

// The optimizer update run inside backward: once the sums of a piece of a
// bucket reach its owner, the owner updates those elements at once and
// sends the new values to the other ranks, while backward still produces
// the rest of the gradients. The arithmetic is the trainer's own update
// (optim.rs), op for op with the same coefficients, so the result is the
// same whether the update runs here or after backward.
struct HtUpdate {
  bool on = false;
  bool adamw = false;
  // This rank's optimizer state, flat over the elements it owns
  // [own_lo, own_hi) (the tensors the trainer holds; the same storage).
  at::Tensor m, v;
  int64_t own_lo = 0;
  int64_t own_hi = 0;
  // SGD: weight decay, momentum, -lr. AdamW: (1 - lr wd) or 1, beta1,
  // 1 - beta1, beta2, 1 - beta2, bias correction 2, eps, -lr / bias
  // correction 1. Computed by the trainer for this step.
  std::vector<double> c;
  // This backward: elements updated here, elements received from owners,
  // and pieces updated while backward still had gradients to produce.
  std::atomic<int64_t> updated{0};
  std::atomic<int64_t> received{0};
  std::atomic<int64_t> early{0};
  std::atomic<int64_t> update_ns{0};  // time spent updating
};

// Who updates which elements of the flat parameter buffer (ZeRO-1 with
// unequal shards). While set, a bucket's gradient is summed only where its
// owner needs it: each rank sends the other owners their segments and
// receives its own from every rank (point-to-point, about half the bytes
// of an all-reduce); the owner then holds the exact sum of its elements and
// the rest of the bucket keeps this rank's local gradient, which nothing
// reads (the update touches only the owned range, and the owners'
// broadcasts after it bring every rank the whole result).
struct HtShards {
  std::mutex mu;
  // Group rank r owns flat elements [bounds[r].first, bounds[r].second);
  // empty: every rank needs the whole sum (all-reduce).
  std::vector<std::pair<int64_t, int64_t>> bounds;
  at::Tensor flat;                 // the flat parameter buffer
  const char* base = nullptr;  // the flat buffer's first byte
  int64_t numel = 0;
  int64_t elem = 0;
  uint32_t calls = 0;  // hook calls so far: the message tags
  HtUpdate update;
};

// Part of a segment: [off, off + len) of the bucket's buffer holds the
// flat parameter elements [flat, flat + len).
struct Run {
  int64_t off;
  int64_t len;
  int64_t flat;
};

// One message of a bucket: [off, off + len) of its buffer, summed for
// `owner`. A bucket lays out its gradients in the order they become ready,
// which need not be the flat buffer's, so one message may cover several
// runs of the flat buffer (`runs`, in buffer order): one message per
// owner and bucket (or piece) whatever the layout, as each message costs
// every rank wake-ups and system calls.
struct Segment {
  int64_t off;
  int64_t len;
  int owner;
  std::vector<Run> runs;
};

// [k, k + n) of a segment, with its runs cut to match.
Segment cut(const Segment& sg, int64_t k, int64_t n) {
  Segment out{sg.off + k, n, sg.owner, {}};
  for (const auto& r : sg.runs) {
    const int64_t a = std::max(r.off, out.off);
    const int64_t b = std::min(r.off + r.len, out.off + n);
    if (a < b) out.runs.push_back({a, b - a, r.flat + (a - r.off)});
  }
  return out;
}

// Where a segment's new values can travel in the flat buffer's order: the
// first flat element, when its runs tile one contiguous stretch of the flat
// buffer (in whatever order the bucket holds them: a layer's bias gradient
// comes before its weight's), else -1. Then the owner sends that stretch of
// its parameters and the others receive it straight into theirs, with no
// gather into the bucket's order and no scatter out of it (a copy of the
// whole segment on each side). Every rank cuts the same segments, so all
// agree on the layout of each reply.
int64_t flat_span(const Segment& sg) {
  std::vector<std::pair<int64_t, int64_t>> spans;
  spans.reserve(sg.runs.size());
  for (const auto& r : sg.runs) spans.emplace_back(r.flat, r.len);
  std::sort(spans.begin(), spans.end());
  int64_t next = spans.empty() ? -1 : spans.front().first;
  for (const auto& [f, n] : spans) {
    if (f != next) return -1;
    next += n;
  }
  return spans.empty() || next - spans.front().first != sg.len ? -1 : spans.front().first;
}

// Pieces of at most this many elements when the update runs in backward
// (4 MiB of float): an owner updates and sends one piece while the next
// one's sums are still arriving. Smaller pieces measured slower here (more
// messages for the same bytes).
constexpr int64_t kPiece = int64_t{1} << 20;

// Element-wise work on the hooks' worker runs in slices too small for
// ATen's intra-op parallelism (GRAIN_SIZE, 32768 elements): such a thread
// would otherwise start its own OpenMP team beside the rank's compute
// threads (the last bucket, launched once backward's compute is done, is
// not sliced). Element-wise ops give the same values whatever the slicing.
constexpr int64_t kSerialSlice = int64_t{1} << 14;

template <typename F>
void sliced(int64_t len, int64_t slice, F&& f) {
  for (int64_t k = 0; k < len;) {
    const int64_t n = std::min(slice, len - k);
    f(k, n);
    k += n;
  }
}

// The trainer's update (optim.rs, Optimizer::update), the same ops in the
// same order, for what fused_sgd does not take (AdamW, not float32).
void apply_update(const HtUpdate& u, at::Tensor p, at::Tensor g, at::Tensor m, at::Tensor v) {
  const auto& c = u.c;
  if (u.adamw) {
    if (c[0] != 1.0) p.mul_(c[0]);
    m.mul_(c[1]).add_(g * c[2]);
    v.mul_(c[3]).add_(g * g * c[4]);
    auto denom = (v / c[5]).sqrt() + c[6];
    p.add_(m / denom * c[7]);
    return;
  }
  if (c[0] != 0.0) g = g + p * c[0];
  if (c[1] != 0.0) {
    m.mul_(c[1]).add_(g);
    p.add_(m * c[2]);
  } else {
    p.add_(g * c[2]);
  }
}

// Message tags, the same on every rank (buckets launch in one order):
// the hook call, the phase (0: gradient sums to the owner, 1: updated
// values from it) and the piece.
int tag_of(uint32_t call, int phase, size_t piece) {
  return static_cast<int>(((call % 1024u) << 20) | (static_cast<uint32_t>(phase) << 19) |
                          (piece & 0x7ffffu));
}

class HtSumHook : public c10d::CppCommHookInterface<c10::intrusive_ptr<c10d::ProcessGroup>> {
 public:
  // cuda_via_gloo: CUDA buckets go through Gloo (no NCCL), staged through
  // host memory, so they take the same path as a CPU rank's buckets: in a
  // mixed gang every rank must run the same collectives.
  HtSumHook(c10::intrusive_ptr<c10d::ProcessGroup> pg, std::shared_ptr<HtReducerTrace> trace,
            std::shared_ptr<HtShards> shards, c10::intrusive_ptr<c10d::Backend> gloo,
            std::chrono::milliseconds timeout, bool cuda_via_gloo, int64_t params)
      : CppCommHookInterface(std::move(pg)),
        trace_(std::move(trace)),
        shards_(std::move(shards)),
        gloo_(std::move(gloo)),
        timeout_(timeout),
        cuda_via_gloo_(cuda_via_gloo),
        params_(params) {}

  c10::intrusive_ptr<c10::ivalue::Future> runHook(c10d::GradBucket& bucket) override {
    {
      std::lock_guard<std::mutex> lock(trace_->mu);
      trace_->ready_at_launch.push_back(trace_->ready.load());
    }
    std::vector<Segment> segs;
    uint32_t call = 0;
    bool update = false;
    if (plan(bucket, segs, call, update)) {
      // The last bucket launches once backward's compute is done: its
      // work may use the rank's intra-op threads.
      const int64_t slice = bucket.isLast() ? INT64_MAX : kSerialSlice;
      if (update) return reduce_update_share(bucket.getBufferRef(), std::move(segs), call, slice);
      return reduce_to_owners(bucket.getBufferRef(), std::move(segs), call, slice);
    }
    std::vector<at::Tensor> tensors{bucket.getBufferRef()};
    return state_->allreduce(tensors)->getFuture();
  }

 private:
  // The bucket's segments by owner, in buffer order; false: all-reduce it.
  // Nothing here may depend on this rank's device unless every rank's does
  // alike (a CUDA bucket with NCCL: then every rank is on CUDA).
  bool plan(c10d::GradBucket& bucket, std::vector<Segment>& segs, uint32_t& call,
            bool& update) {
    const at::Tensor& buf = bucket.getBufferRef();
    if (!buf.is_contiguous() || (!buf.is_cpu() && !cuda_via_gloo_)) return false;
    std::lock_guard<std::mutex> lock(shards_->mu);
    const auto& bounds = shards_->bounds;
    if (bounds.size() != static_cast<size_t>(state_->getSize()) || shards_->base == nullptr)
      return false;
    const int64_t elem = shards_->elem;
    if (elem != static_cast<int64_t>(buf.element_size())) return false;
    const auto grads = bucket.getGradients();
    const auto params = bucket.getParameters();
    if (grads.size() != params.size()) return false;
    const char* bbase = static_cast<const char*>(buf.const_data_ptr());
    for (size_t i = 0; i < grads.size(); ++i) {
      const char* pp = static_cast<const char*>(params[i].const_data_ptr());
      const int64_t n = grads[i].numel();
      const int64_t f = (pp - shards_->base) / elem;
      if (pp < shards_->base || f + n > shards_->numel || !params[i].is_contiguous())
        return false;
      const int64_t o = (static_cast<const char*>(grads[i].const_data_ptr()) - bbase) / elem;
      for (int q = 0; q < static_cast<int>(bounds.size()); ++q) {
        const int64_t a = std::max(f, bounds[q].first);
        const int64_t b = std::min(f + n, bounds[q].second);
        if (a >= b) continue;
        const int64_t off = o + (a - f);
        if (!segs.empty() && segs.back().owner == q && segs.back().off + segs.back().len == off) {
          Segment& sg = segs.back();
          sg.len += b - a;
          Run& last = sg.runs.back();
          if (last.off + last.len == off && last.flat + last.len == a) {
            last.len += b - a;
          } else {
            sg.runs.push_back({off, b - a, a});
          }
        } else {
          segs.push_back({off, b - a, q, {{off, b - a, a}}});
        }
      }
    }
    call = shards_->calls++;
    update = shards_->update.on && buf.is_cpu();
    if (!update) return true;
    // Pieces, so the owner's update and sends pipeline with the sums.
    std::vector<Segment> pieces;
    for (const auto& sg : segs) {
      if (sg.len <= kPiece) {
        pieces.push_back(sg);
        continue;
      }
      for (int64_t k = 0; k < sg.len; k += kPiece) {
        pieces.push_back(cut(sg, k, std::min(kPiece, sg.len - k)));
      }
    }
    segs = std::move(pieces);
    return true;
  }

  c10::intrusive_ptr<c10::ivalue::Future> reduce_to_owners(at::Tensor bucket,
                                                           std::vector<Segment> segs,
                                                           uint32_t call, int64_t slice) {
    // A CUDA bucket is summed in a host copy (the copy waits for backward's
    // kernels) and copied back once its owners' sums are in.
    at::Tensor buf = bucket.is_cpu() ? bucket : bucket.to(at::kCPU);
    const int me = state_->getRank();
    const int world = state_->getSize();
    std::vector<c10::intrusive_ptr<c10d::Work>> works;
    // (segment, peer, received) for the segments this rank owns.
    std::vector<std::pair<size_t, at::Tensor>> received;
    for (size_t i = 0; i < segs.size(); ++i) {
      const int tag = tag_of(call, 0, i);
      at::Tensor part = buf.narrow(0, segs[i].off, segs[i].len);
      if (segs[i].owner != me) {
        std::vector<at::Tensor> t{part};
        works.push_back(gloo_->send(t, segs[i].owner, tag));
        continue;
      }
      for (int peer = 0; peer < world; ++peer) {
        if (peer == me) continue;
        std::vector<at::Tensor> t{at::empty_like(part)};
        works.push_back(gloo_->recv(t, peer, tag));
        received.emplace_back(i, t[0]);
      }
    }
    auto fut = bucket.is_cpu()
                   ? c10::make_intrusive<c10::ivalue::Future>(c10::ListType::ofTensors())
                   : c10::make_intrusive<c10::ivalue::Future>(
                         c10::ListType::ofTensors(), std::vector<c10::Device>{bucket.device()});
    auto timeout = timeout_;
    hook_worker().post([works = std::move(works), received = std::move(received),
                            segs = std::move(segs), buf, bucket, fut, timeout, slice]() mutable {
      try {
        for (auto& w : works) ht::wait_work(w, timeout);
        // Peers in rank order: the same sum on every run.
        for (auto& got : received) {
          const Segment& sg = segs[got.first];
          const at::Tensor& t = got.second;
          at::Tensor g = buf.narrow(0, sg.off, sg.len);
          sliced(sg.len, slice, [&](int64_t k, int64_t n) { g.narrow(0, k, n).add_(t.narrow(0, k, n)); });
        }
        if (!bucket.is_cpu()) bucket.copy_(buf);
        fut->markCompleted(c10::IValue(std::vector<at::Tensor>{bucket}));
      } catch (...) {
        fut->setError(std::current_exception());
      }
    });
    return fut;
  }

  // The update in backward (CPU buckets): each piece's sums go to its
  // owner, who adds them, updates the piece and sends the new values to
  // every other rank; the others receive them straight into their
  // parameters. The bucket's future completes when every piece is in, so
  // backward returns with the step's update done everywhere.
  c10::intrusive_ptr<c10::ivalue::Future> reduce_update_share(at::Tensor buf,
                                                              std::vector<Segment> segs,
                                                              uint32_t call, int64_t slice) {
    const int me = state_->getRank();
    const int world = state_->getSize();
    at::Tensor flat;
    HtUpdate* u = nullptr;
    {
      std::lock_guard<std::mutex> lock(shards_->mu);
      flat = shards_->flat;
      u = &shards_->update;
    }
    std::vector<c10::intrusive_ptr<c10d::Work>> works;
    // For each piece this rank owns: (piece, the peers' sums in rank order).
    std::vector<std::pair<size_t, std::vector<std::pair<c10::intrusive_ptr<c10d::Work>, at::Tensor>>>>
        owned;
    // Pieces whose runs do not tile one stretch of the flat buffer: their
    // new values arrive in the bucket's buffer (this rank's own gradient
    // there is no longer needed: the owner replies only once it has all of
    // this rank's sums).
    std::vector<size_t> scatter;
    for (size_t i = 0; i < segs.size(); ++i) {
      const Segment& sg = segs[i];
      at::Tensor part = buf.narrow(0, sg.off, sg.len);
      if (sg.owner != me) {
        std::vector<at::Tensor> t{part};
        works.push_back(gloo_->send(t, sg.owner, tag_of(call, 0, i)));
        const int64_t from = flat_span(sg);
        std::vector<at::Tensor> r{from >= 0 ? flat.narrow(0, from, sg.len) : part};
        works.push_back(gloo_->recv(r, sg.owner, tag_of(call, 1, i)));
        if (from < 0) scatter.push_back(i);
        continue;
      }
      std::vector<std::pair<c10::intrusive_ptr<c10d::Work>, at::Tensor>> sums;
      for (int peer = 0; peer < world; ++peer) {
        if (peer == me) continue;
        std::vector<at::Tensor> t{at::empty_like(part)};
        auto w = gloo_->recv(t, peer, tag_of(call, 0, i));
        sums.emplace_back(std::move(w), t[0]);
      }
      owned.emplace_back(i, std::move(sums));
    }
    auto fut = c10::make_intrusive<c10::ivalue::Future>(c10::ListType::ofTensors());
    auto timeout = timeout_;
    auto gloo = gloo_;
    auto trace = trace_;
    auto shards = shards_;
    const int64_t params = params_;
    hook_worker().post([works = std::move(works), owned = std::move(owned),
                            segs = std::move(segs), scatter = std::move(scatter), buf, flat, u, fut,
                            timeout, gloo, trace, shards, params, me, world, call,
                            slice]() mutable {
      try {
        at::NoGradGuard no_grad;
        for (auto& [i, sums] : owned) {
          const auto& sg = segs[i];
          at::Tensor g = buf.narrow(0, sg.off, sg.len);
          // Every peer's sums but the last are added first (rank order);
          // the last is added in the update's own pass.
          for (size_t k = 0; k < sums.size(); ++k) {
            ht::wait_work(sums[k].first, timeout);
            if (k + 1 == sums.size()) break;
            const at::Tensor& t = sums[k].second;
            sliced(sg.len, slice, [&](int64_t k, int64_t n) { g.narrow(0, k, n).add_(t.narrow(0, k, n)); });
          }
          const int64_t t0 = steady_ns();
          // The last bucket's work may use the rank's intra-op threads.
          const bool parallel = slice == INT64_MAX;
          for (const Run& run : sg.runs) {
            at::Tensor p = flat.narrow(0, run.flat, run.len);
            at::Tensor gr = buf.narrow(0, run.off, run.len);
            const int64_t at_state = run.flat - u->own_lo;
            at::Tensor m = u->m.narrow(0, at_state, run.len);
            at::Tensor v = u->adamw ? u->v.narrow(0, at_state, run.len) : at::Tensor();
            at::Tensor last;
            if (!sums.empty()) last = sums.back().second.narrow(0, run.off - sg.off, run.len);
            if (u->adamw ||
                !fused_sgd(u->c.data(), u->c.size(), p, gr, last.defined() ? &last : nullptr, m,
                           parallel)) {
              if (last.defined()) {
                sliced(run.len, slice, [&](int64_t k, int64_t n) { gr.narrow(0, k, n).add_(last.narrow(0, k, n)); });
              }
              sliced(run.len, slice, [&](int64_t k, int64_t n) {
                apply_update(*u, p.narrow(0, k, n), gr.narrow(0, k, n), m.narrow(0, k, n),
                             v.defined() ? v.narrow(0, k, n) : v);
              });
            }
          }
          u->update_ns.fetch_add(steady_ns() - t0);
          if (trace->ready.load() < params) u->early.fetch_add(1);
          u->updated.fetch_add(sg.len);
          // Runs that tile one stretch of the flat buffer: its new values
          // go straight from the parameters (flat_span); others: gathered
          // into the piece's place in the bucket (its gradient sums are
          // spent), so they still go in one message.
          at::Tensor out;
          if (const int64_t from = flat_span(sg); from >= 0) {
            out = flat.narrow(0, from, sg.len);
          } else {
            for (const Run& run : sg.runs) {
              at::Tensor dst = buf.narrow(0, run.off, run.len);
              at::Tensor src = flat.narrow(0, run.flat, run.len);
              sliced(run.len, slice, [&](int64_t k, int64_t n) { dst.narrow(0, k, n).copy_(src.narrow(0, k, n)); });
            }
            out = buf.narrow(0, sg.off, sg.len);
          }
          for (int peer = 0; peer < world; ++peer) {
            if (peer == me) continue;
            std::vector<at::Tensor> t{out};
            works.push_back(gloo->send(t, peer, tag_of(call, 1, i)));
          }
        }
        for (auto& w : works) ht::wait_work(w, timeout);
        for (size_t i : scatter) {
          for (const Run& run : segs[i].runs) {
            at::Tensor dst = flat.narrow(0, run.flat, run.len);
            at::Tensor src = buf.narrow(0, run.off, run.len);
            sliced(run.len, slice, [&](int64_t k, int64_t n) { dst.narrow(0, k, n).copy_(src.narrow(0, k, n)); });
          }
        }
        int64_t got = 0;
        for (const auto& sg : segs) {
          if (sg.owner != me) got += sg.len;
        }
        u->received.fetch_add(got);
        fut->markCompleted(c10::IValue(std::vector<at::Tensor>{buf}));
      } catch (...) {
        fut->setError(std::current_exception());
      }
    });
    return fut;
  }

  std::shared_ptr<HtReducerTrace> trace_;
  std::shared_ptr<HtShards> shards_;
  c10::intrusive_ptr<c10d::Backend> gloo_;
  std::chrono::milliseconds timeout_;
  bool cuda_via_gloo_;
  int64_t params_;
};

struct HtReducer {
  c10::intrusive_ptr<c10d::ProcessGroup> pg;
  std::unique_ptr<c10d::Reducer> reducer;
  std::shared_ptr<HtReducerTrace> trace;
  std::shared_ptr<HtShards> shards;
  std::vector<std::shared_ptr<torch::autograd::Node>> accumulators;
  int64_t params = 0;
};

}  // namespace

extern "C" {

// A Reducer over `n` parameters (all on one device) for group h.
int ht_reducer_create(void* h, at::Tensor** params, size_t n, int64_t bucket_bytes,
                      int64_t first_bucket_bytes, void** out, char* err, size_t err_len) {
  *out = nullptr;
  return guarded(err, err_len, [&] {
    auto g = static_cast<HtGroup*>(h);
    auto r = std::make_unique<HtReducer>();
    r->pg = c10::make_intrusive<c10d::ProcessGroup>(g->store, g->rank, g->world);
    r->pg->setBackend(c10::DeviceType::CPU, c10d::ProcessGroup::BackendType::GLOO, g->gloo);
    r->pg->setDefaultBackend(c10d::ProcessGroup::BackendType::GLOO);
#ifdef HT_USE_NCCL
    if (g->nccl) {
      r->pg->setBackend(c10::DeviceType::CUDA, c10d::ProcessGroup::BackendType::NCCL, g->nccl);
    } else {
      r->pg->setBackend(c10::DeviceType::CUDA, c10d::ProcessGroup::BackendType::GLOO, g->gloo);
    }
#else
    r->pg->setBackend(c10::DeviceType::CUDA, c10d::ProcessGroup::BackendType::GLOO, g->gloo);
#endif
#ifdef HT_USE_NCCL
    const bool cuda_via_gloo = !g->nccl;
#else
    const bool cuda_via_gloo = true;
#endif
    std::vector<at::Tensor> ps;
    ps.reserve(n);
    for (size_t i = 0; i < n; ++i) ps.push_back(*params[i]);
    // Gradients become ready roughly in reverse order of definition: fill
    // the first buckets from the last parameters.
    std::vector<int64_t> order(n);
    for (size_t i = 0; i < n; ++i) order[i] = static_cast<int64_t>(n - 1 - i);
    std::vector<at::Tensor> reversed;
    reversed.reserve(n);
    for (auto i : order) reversed.push_back(ps[i]);
    auto assignment = c10d::compute_bucket_assignment_by_size(
        reversed, {static_cast<size_t>(first_bucket_bytes), static_cast<size_t>(bucket_bytes)},
        std::vector<bool>(n, false), order);
    auto buckets = std::get<0>(assignment);
    r->trace = std::make_shared<HtReducerTrace>();
    r->reducer = std::make_unique<c10d::Reducer>(
        ps, buckets, r->pg, std::vector<bool>(n, false), bucket_bytes,
        /*find_unused_parameters=*/false, /*gradient_as_bucket_view=*/true,
        std::unordered_map<size_t, std::string>{}, first_bucket_bytes,
        /*skip_all_reduce_unused_params=*/false, /*use_python_reducer=*/false,
        std::vector<int64_t>{});
    r->shards = std::make_shared<HtShards>();
    r->reducer->register_comm_hook(
        std::make_unique<HtSumHook>(r->pg, r->trace, r->shards, g->gloo, g->timeout,
                                    cuda_via_gloo, static_cast<int64_t>(n)));
    // Count ready gradients (after the Reducer's own hook on each).
    auto trace = r->trace;
    for (auto& p : ps) {
      auto acc = torch::autograd::impl::grad_accumulator(p);
      acc->add_post_hook(std::make_unique<torch::autograd::utils::LambdaPostHook>(
          [trace](const torch::autograd::variable_list& outputs,
                  const torch::autograd::variable_list&) {
            trace->last_ready_ns.store(steady_ns());
            trace->ready.fetch_add(1);
            return outputs;
          }));
      r->accumulators.push_back(std::move(acc));
    }
    r->params = static_cast<int64_t>(n);
    *out = r.release();
  });
}

// Before forward: rebuild buckets in gradient order after the first step.
int ht_reducer_prepare_forward(void* r, char* err, size_t err_len) {
  return guarded(err, err_len, [&] {
    auto red = static_cast<HtReducer*>(r);
    red->reducer->rebuild_buckets();
    red->reducer->prepare_for_forward();
  });
}

// Before backward of `loss`: arm the Reducer and reset the trace.
int ht_reducer_prepare_backward(void* r, at::Tensor* loss, char* err, size_t err_len) {
  return guarded(err, err_len, [&] {
    auto red = static_cast<HtReducer*>(r);
    red->trace->ready.store(0);
    red->trace->armed_ns.store(steady_ns());
    red->trace->last_ready_ns.store(0);
    {
      std::lock_guard<std::mutex> lock(red->trace->mu);
      red->trace->ready_at_launch.clear();
    }
    red->reducer->prepare_for_backward({*loss});
  });
}

// The last backward's trace: for each bucket launch, the number of
// gradients ready then, into out[0..cap); returns the number of launches
// (and the parameter count in *params, and in *compute_ns the time from
// arming to the last gradient being ready: the local backward).
int64_t ht_reducer_trace(void* r, int64_t* out, int64_t cap, int64_t* params,
                         int64_t* compute_ns) {
  auto red = static_cast<HtReducer*>(r);
  int64_t last = red->trace->last_ready_ns.load();
  *compute_ns = last > 0 ? last - red->trace->armed_ns.load() : 0;
  std::lock_guard<std::mutex> lock(red->trace->mu);
  auto& v = red->trace->ready_at_launch;
  for (int64_t i = 0; i < cap && i < static_cast<int64_t>(v.size()); ++i) out[i] = v[i];
  *params = red->params;
  return static_cast<int64_t>(v.size());
}

// Sum each bucket only for the owners of its elements: group rank q owns
// elements [bounds[2q], bounds[2q+1]) of the flat buffer *flat (n = the
// group's size). n = 0: every rank needs the whole sum (all-reduce).
int ht_reducer_set_shards(void* r, at::Tensor* flat, const int64_t* bounds, size_t n,
                          char* err, size_t err_len) {
  return guarded(err, err_len, [&] {
    auto red = static_cast<HtReducer*>(r);
    std::lock_guard<std::mutex> lock(red->shards->mu);
    red->shards->bounds.clear();
    red->shards->base = nullptr;
    red->shards->flat = at::Tensor();
    red->shards->update.on = false;
    if (n == 0 || flat == nullptr) return;
    if (!flat->is_contiguous()) throw std::runtime_error("the flat parameter buffer is not contiguous");
    for (size_t q = 0; q < n; ++q) red->shards->bounds.emplace_back(bounds[2 * q], bounds[2 * q + 1]);
    red->shards->base = static_cast<const char*>(flat->const_data_ptr());
    red->shards->flat = *flat;
    red->shards->numel = flat->numel();
    red->shards->elem = static_cast<int64_t>(flat->element_size());
  });
}

// The update in backward for the next backward (call before each): this
// rank's state m (and v for AdamW) over the flat elements [own_lo, own_hi)
// and the step's n coefficients (see HtUpdate). on = 0 turns it off.
// Needs the shards set (ht_reducer_set_shards) and a CPU flat buffer.
int ht_reducer_set_update(void* r, int on, int adamw, at::Tensor* m, at::Tensor* v,
                          int64_t own_lo, int64_t own_hi, const double* c, size_t n, char* err,
                          size_t err_len) {
  return guarded(err, err_len, [&] {
    auto red = static_cast<HtReducer*>(r);
    std::lock_guard<std::mutex> lock(red->shards->mu);
    auto& u = red->shards->update;
    u.updated.store(0);
    u.received.store(0);
    u.early.store(0);
    u.update_ns.store(0);
    u.on = false;
    if (!on) return;
    if (red->shards->base == nullptr || !red->shards->flat.is_cpu())
      throw std::runtime_error("the update in backward needs the optimizer shards on the CPU");
    const size_t want = adamw ? 8 : 3;
    if (n != want || m == nullptr || (adamw && v == nullptr))
      throw std::runtime_error("the update in backward got the wrong optimizer state");
    if (m->numel() != own_hi - own_lo || (adamw && v->numel() != own_hi - own_lo))
      throw std::runtime_error("the optimizer state does not cover this rank's elements");
    u.adamw = adamw != 0;
    u.m = *m;
    u.v = adamw ? *v : at::Tensor();
    u.own_lo = own_lo;
    u.own_hi = own_hi;
    u.c.assign(c, c + n);
    u.on = true;
  });
}

// What the last backward's update did: elements updated here, elements
// received from their owners, pieces updated before backward ended, and
// nanoseconds spent updating.
void ht_reducer_updated(void* r, int64_t* updated, int64_t* received, int64_t* early,
                        int64_t* update_ns) {
  auto red = static_cast<HtReducer*>(r);
  *updated = red->shards->update.updated.load();
  *received = red->shards->update.received.load();
  *early = red->shards->update.early.load();
  *update_ns = red->shards->update.update_ns.load();
}

void ht_reducer_destroy(void* r) {
  try {
    delete static_cast<HtReducer*>(r);
  } catch (...) {
  }
}
}
