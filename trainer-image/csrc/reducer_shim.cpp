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
  const char* base = nullptr;  // the flat buffer's first byte
  int64_t numel = 0;
  int64_t elem = 0;
  uint32_t calls = 0;  // hook calls so far: the message tags
};

// One piece of a bucket: [off, off + len) of its buffer, summed for `owner`.
struct Segment {
  int64_t off;
  int64_t len;
  int owner;
};

class HtSumHook : public c10d::CppCommHookInterface<c10::intrusive_ptr<c10d::ProcessGroup>> {
 public:
  // cuda_via_gloo: CUDA buckets go through Gloo (no NCCL), staged through
  // host memory, so they take the same path as a CPU rank's buckets: in a
  // mixed gang every rank must run the same collectives.
  HtSumHook(c10::intrusive_ptr<c10d::ProcessGroup> pg, std::shared_ptr<HtReducerTrace> trace,
            std::shared_ptr<HtShards> shards, c10::intrusive_ptr<c10d::Backend> gloo,
            std::chrono::milliseconds timeout, bool cuda_via_gloo)
      : CppCommHookInterface(std::move(pg)),
        trace_(std::move(trace)),
        shards_(std::move(shards)),
        gloo_(std::move(gloo)),
        timeout_(timeout),
        cuda_via_gloo_(cuda_via_gloo) {}

  c10::intrusive_ptr<c10::ivalue::Future> runHook(c10d::GradBucket& bucket) override {
    {
      std::lock_guard<std::mutex> lock(trace_->mu);
      trace_->ready_at_launch.push_back(trace_->ready.load());
    }
    std::vector<Segment> segs;
    uint32_t call = 0;
    if (plan(bucket, segs, call)) return reduce_to_owners(bucket.getBufferRef(), segs, call);
    std::vector<at::Tensor> tensors{bucket.getBufferRef()};
    return state_->allreduce(tensors)->getFuture();
  }

 private:
  // The bucket's segments by owner, in buffer order; false: all-reduce it.
  // Nothing here may depend on this rank's device unless every rank's does
  // alike (a CUDA bucket with NCCL: then every rank is on CUDA).
  bool plan(c10d::GradBucket& bucket, std::vector<Segment>& segs, uint32_t& call) {
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
          segs.back().len += b - a;
        } else {
          segs.push_back({off, b - a, q});
        }
      }
    }
    call = shards_->calls++;
    return true;
  }

  c10::intrusive_ptr<c10::ivalue::Future> reduce_to_owners(at::Tensor bucket,
                                                           std::vector<Segment> segs,
                                                           uint32_t call) {
    // A CUDA bucket is summed in a host copy (the copy waits for backward's
    // kernels) and copied back once its owners' sums are in.
    at::Tensor buf = bucket.is_cpu() ? bucket : bucket.to(at::kCPU);
    const int me = state_->getRank();
    const int world = state_->getSize();
    std::vector<c10::intrusive_ptr<c10d::Work>> works;
    // (segment, peer, received) for the segments this rank owns.
    std::vector<std::pair<size_t, at::Tensor>> received;
    for (size_t i = 0; i < segs.size(); ++i) {
      // Tags are the same on every rank: buckets launch in one order.
      const int tag = static_cast<int>(((call % 4096u) << 18) | (i & 0x3ffffu));
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
    std::thread([works = std::move(works), received = std::move(received),
                 segs = std::move(segs), buf, bucket, fut, timeout]() mutable {
      try {
        for (auto& w : works) ht::wait_work(w, timeout);
        // Peers in rank order: the same sum on every run.
        for (auto& [i, t] : received) buf.narrow(0, segs[i].off, segs[i].len).add_(t);
        if (!bucket.is_cpu()) bucket.copy_(buf);
        fut->markCompleted(c10::IValue(std::vector<at::Tensor>{bucket}));
      } catch (...) {
        fut->setError(std::current_exception());
      }
    }).detach();
    return fut;
  }

  std::shared_ptr<HtReducerTrace> trace_;
  std::shared_ptr<HtShards> shards_;
  c10::intrusive_ptr<c10d::Backend> gloo_;
  std::chrono::milliseconds timeout_;
  bool cuda_via_gloo_;
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
                                    cuda_via_gloo));
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
    if (n == 0 || flat == nullptr) return;
    if (!flat->is_contiguous()) throw std::runtime_error("the flat parameter buffer is not contiguous");
    for (size_t q = 0; q < n; ++q) red->shards->bounds.emplace_back(bounds[2 * q], bounds[2 * q + 1]);
    red->shards->base = static_cast<const char*>(flat->const_data_ptr());
    red->shards->numel = flat->numel();
    red->shards->elem = static_cast<int64_t>(flat->element_size());
  });
}

void ht_reducer_destroy(void* r) {
  try {
    delete static_cast<HtReducer*>(r);
  } catch (...) {
  }
}
}
