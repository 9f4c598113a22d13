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

class HtSumHook : public c10d::CppCommHookInterface<c10::intrusive_ptr<c10d::ProcessGroup>> {
 public:
  HtSumHook(c10::intrusive_ptr<c10d::ProcessGroup> pg, std::shared_ptr<HtReducerTrace> trace)
      : CppCommHookInterface(std::move(pg)), trace_(std::move(trace)) {}

  c10::intrusive_ptr<c10::ivalue::Future> runHook(c10d::GradBucket& bucket) override {
    {
      std::lock_guard<std::mutex> lock(trace_->mu);
      trace_->ready_at_launch.push_back(trace_->ready.load());
    }
    std::vector<at::Tensor> tensors{bucket.getBufferRef()};
    return state_->allreduce(tensors)->getFuture();
  }

 private:
  std::shared_ptr<HtReducerTrace> trace_;
};

struct HtReducer {
  c10::intrusive_ptr<c10d::ProcessGroup> pg;
  std::unique_ptr<c10d::Reducer> reducer;
  std::shared_ptr<HtReducerTrace> trace;
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
    r->reducer->register_comm_hook(std::make_unique<HtSumHook>(r->pg, r->trace));
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

void ht_reducer_destroy(void* r) {
  try {
    delete static_cast<HtReducer*>(r);
  } catch (...) {
  }
}
}
