// autograd_shim.cpp: the differentiable all-reduce synchronised BatchNorm
// runs on (see the comment below).
#include "shim.h"

#include <atomic>
#include <cstdint>
#include <vector>

using namespace ht;

// ---------------------------------------------------------------------------
// A differentiable SUM all-reduce: forward returns the sum over ranks of x,
// backward returns the sum over ranks of the incoming gradient. Synchronised
// BatchNorm reduces its per-channel sums through it, so autograd carries the
// cross-rank terms of the backward pass (the global sums of dy and dy·x̂).
#include <torch/csrc/autograd/custom_function.h>

namespace {

// Nanoseconds spent inside the differentiable all-reduce (waiting for the
// other ranks included), so the trainer can tell compute from waiting.
std::atomic<int64_t> g_autograd_collective_ns{0};

void allreduce_staged(HtGroup* g, at::Tensor& t) {
  int64_t start = steady_ns();
  bool staged = false;
  at::Tensor work = t;
#ifdef HT_USE_NCCL
  if (t.is_cuda() && !g->nccl) staged = true;
#else
  if (t.is_cuda()) staged = true;
#endif
  if (staged) work = t.to(at::kCPU);
  std::vector<at::Tensor> ts{work};
  c10d::AllreduceOptions o;
  o.reduceOp = c10d::ReduceOp::SUM;
  o.timeout = g->timeout;
  wait_work(backend_for(g, work).allreduce(ts, o), g->timeout);
  if (staged) t.copy_(work);
  g_autograd_collective_ns.fetch_add(steady_ns() - start);
}

struct HtAllReduceSum : public torch::autograd::Function<HtAllReduceSum> {
  static at::Tensor forward(torch::autograd::AutogradContext* ctx, const at::Tensor& x,
                            int64_t handle) {
    ctx->saved_data["pg"] = handle;
    auto y = x.detach().contiguous().clone();
    allreduce_staged(reinterpret_cast<HtGroup*>(handle), y);
    return y;
  }
  static torch::autograd::variable_list backward(torch::autograd::AutogradContext* ctx,
                                                 torch::autograd::variable_list grads) {
    auto g = reinterpret_cast<HtGroup*>(ctx->saved_data["pg"].toInt());
    auto dy = grads[0].contiguous().clone();
    allreduce_staged(g, dy);
    return {dy, at::Tensor()};
  }
};

}  // namespace

extern "C" {
int64_t ht_autograd_collective_ns() { return g_autograd_collective_ns.load(); }

// *out = all-reduce-sum(*x) with autograd (see HtAllReduceSum); the caller
// owns *out. Errors in the backward pass surface from the backward call.
int ht_allreduce_sum_autograd(void* h, at::Tensor* x, at::Tensor** out, char* err,
                              size_t err_len) {
  *out = nullptr;
  return guarded(err, err_len, [&] {
    auto y = HtAllReduceSum::apply(*x, reinterpret_cast<int64_t>(h));
    *out = new at::Tensor(std::move(y));
  });
}

// Drop the gradients of params[0..n) (Python's `p.grad = None`): backward's
// next gradient is then taken as it is (AccumulateGrad steals it) and the
// Reducer copies it into its bucket once, where zeroing in place would cost
// a fill and an add over every gradient.
void ht_clear_grads(at::Tensor** params, size_t n) {
  for (size_t i = 0; i < n; ++i) params[i]->mutable_grad().reset();
}
}
