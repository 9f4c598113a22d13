// c10d_shim.cpp: a small C ABI over PyTorch's own c10d collectives
// (TCPStore rendezvous, ProcessGroupGloo, optionally ProcessGroupNCCL) for
// the Rust trainer. Every entry point catches C++ exceptions and reports
// them as text in a caller-provided buffer; nothing throws across the ABI.

#include <torch/csrc/distributed/c10d/ProcessGroupGloo.hpp>
#include <torch/csrc/distributed/c10d/TCPStore.hpp>
#include <torch/csrc/distributed/c10d/PrefixStore.hpp>
#include <ATen/Context.h>
#include <c10/util/Logging.h>
#ifdef HT_USE_NCCL
#include <torch/csrc/distributed/c10d/ProcessGroupNCCL.hpp>
#endif

#include <chrono>
#include <cstdint>
#include <cstring>
#include <string>
#include <thread>
#include <vector>

namespace {

struct HtGroup {
  int rank;
  int world;
  std::chrono::milliseconds timeout;
  c10::intrusive_ptr<c10d::Store> store;
  c10::intrusive_ptr<c10d::Backend> gloo;
  // How the Gloo group was built, for sub-groups of it.
  std::shared_ptr<::gloo::transport::Device> device;
  int threads = 2;
#ifdef HT_USE_NCCL
  c10::intrusive_ptr<c10d::Backend> nccl;
#endif
};

void set_err(char* err, size_t len, const std::string& msg) {
  if (err == nullptr || len == 0) return;
  size_t n = std::min(len - 1, msg.size());
  std::memcpy(err, msg.data(), n);
  err[n] = '\0';
}

// Keep only the first line of c10d's (often multi-line, stack-laden) messages.
std::string first_line(const std::string& s) {
  auto pos = s.find('\n');
  return pos == std::string::npos ? s : s.substr(0, pos);
}

template <typename F>
int guarded(char* err, size_t len, F&& f) {
  try {
    f();
    return 0;
  } catch (const c10::Error& e) {
    set_err(err, len, first_line(e.what_without_backtrace()));
  } catch (const std::exception& e) {
    set_err(err, len, first_line(e.what()));
  } catch (...) {
    set_err(err, len, "unknown C++ exception");
  }
  return 1;
}

void wait_work(const c10::intrusive_ptr<c10d::Work>& work,
               std::chrono::milliseconds timeout) {
  if (!work->wait(timeout)) {
    throw std::runtime_error("collective did not complete within " +
                             std::to_string(timeout.count()) + " ms");
  }
}

c10d::Backend& backend_for(HtGroup* g, const at::Tensor& t) {
#ifdef HT_USE_NCCL
  if (g->nccl && t.is_cuda()) return *g->nccl;
#endif
  (void)t;
  return *g->gloo;
}

std::shared_ptr<::gloo::transport::Device> make_device(const char* bind_host,
                                                       const char* iface) {
  if (iface != nullptr && iface[0] != '\0') {
    return c10d::ProcessGroupGloo::createDeviceForInterface(iface);
  }
  if (bind_host != nullptr && bind_host[0] != '\0') {
    return c10d::ProcessGroupGloo::createDeviceForHostname(bind_host);
  }
  return c10d::ProcessGroupGloo::createDefaultDevice();
}

}  // namespace

extern "C" {

// Join the job: TCPStore at master_addr:master_port (rank 0 serves), wait
// until all ranks have arrived (naming the missing ones on timeout), then
// build the process groups. Returns 0 and sets *out, or 1 with err filled.
int ht_pg_create(const char* master_addr, int master_port, int rank, int world,
                 int64_t rendezvous_timeout_ms, int64_t collective_timeout_ms,
                 const char* bind_host, const char* iface, int use_nccl,
                 int gloo_threads, void** out, char* err, size_t err_len) {
  *out = nullptr;
  return guarded(err, err_len, [&] {
    auto rdv = std::chrono::milliseconds(rendezvous_timeout_ms);
    auto coll = std::chrono::milliseconds(collective_timeout_ms);
    auto deadline = std::chrono::steady_clock::now() + rdv;
    c10d::TCPStoreOptions opts;
    opts.port = static_cast<uint16_t>(master_port);
    opts.isServer = rank == 0;
    opts.numWorkers = world;
    opts.waitWorkers = false;
    // A client's connect loop may take about three timeouts; keep the whole
    // rendezvous within rdv, then restore the full timeout for store waits.
    opts.timeout = rank == 0 ? rdv : std::max(std::chrono::milliseconds(500), rdv / 3);
    opts.useLibUV = true;
    c10::intrusive_ptr<c10d::Store> store;
    try {
      store = c10::make_intrusive<c10d::TCPStore>(std::string(master_addr), opts);
    } catch (const std::exception& e) {
      throw std::runtime_error(
          std::string("rendezvous with rank 0 at ") + master_addr + ":" +
          std::to_string(master_port) + " failed: " + first_line(e.what()));
    }
    store->setTimeout(rdv);
    // Arrival: each rank publishes a key, then everyone polls for all keys
    // until the deadline, so a missing rank can be named.
    store->set("ht/arrived/" + std::to_string(rank), std::vector<uint8_t>{1});
    std::vector<int> missing;
    auto describe = [&](const std::vector<int>& m) {
      std::string names;
      for (size_t i = 0; i < m.size(); ++i) {
        names += (i ? ", " : "") + std::to_string(m[i]);
      }
      return std::string(m.size() == 1 ? "rank " : "ranks ") + names +
             " did not join the rendezvous at " + master_addr + ":" +
             std::to_string(master_port) + " within " +
             std::to_string(rendezvous_timeout_ms / 1000.0).substr(0, 6) + " s";
    };
    while (true) {
      std::vector<int> now;
      bool aborted = false;
      try {
        for (int q = 0; q < world; ++q) {
          if (!store->check({"ht/arrived/" + std::to_string(q)})) now.push_back(q);
        }
        aborted = rank != 0 && store->check({"ht/abort"});
      } catch (const std::exception&) {
        // Rank 0's store went away: it gave up waiting for the same ranks.
        throw std::runtime_error(describe(missing.empty() ? now : missing));
      }
      missing = now;
      if (missing.empty()) break;
      if (aborted || std::chrono::steady_clock::now() >= deadline) {
        if (rank == 0) {
          // Tell the ranks that did arrive, and give them a moment to read it.
          try {
            store->set("ht/abort", std::vector<uint8_t>{1});
          } catch (...) {
          }
          std::this_thread::sleep_for(std::chrono::milliseconds(300));
        }
        throw std::runtime_error(describe(missing));
      }
      std::this_thread::sleep_for(std::chrono::milliseconds(50));
    }
    auto g = new HtGroup();
    g->rank = rank;
    g->world = world;
    g->timeout = coll;
    g->store = store;
    try {
      auto gopts = c10d::ProcessGroupGloo::Options::create(rdv);
      g->device = make_device(bind_host, iface);
      g->threads = gloo_threads > 0 ? gloo_threads : 2;
      gopts->devices.push_back(g->device);
      gopts->threads = g->threads;
      auto gstore = c10::make_intrusive<c10d::PrefixStore>("ht/gloo", store);
      auto pg = c10::make_intrusive<c10d::ProcessGroupGloo>(gstore, rank, world, gopts);
      pg->setTimeout(coll);
      g->gloo = pg;
      (void)use_nccl;
    } catch (...) {
      delete g;
      throw;
    }
    *out = g;
  });
}

// Add a ProcessGroupNCCL for CUDA tensors (all ranks must call it together,
// and only when every rank trains on CUDA).
int ht_pg_enable_nccl(void* h, char* err, size_t err_len) {
  auto g = static_cast<HtGroup*>(h);
  return guarded(err, err_len, [&] {
#ifdef HT_USE_NCCL
    auto nopts = c10d::ProcessGroupNCCL::Options::create();
    nopts->timeout = g->timeout;
    auto nstore = c10::make_intrusive<c10d::PrefixStore>("ht/nccl", g->store);
    g->nccl = c10::make_intrusive<c10d::ProcessGroupNCCL>(nstore, g->rank, g->world, nopts);
#else
    (void)g;
    throw std::runtime_error(
        "backend nccl requested but this trainer was built without the `nccl` feature");
#endif
  });
}

// A group of the `n` ranks in `members` (ascending, this rank among them)
// over the same store, keyed by `tag`: every member calls it together, the
// other ranks not at all. Its ranks are positions in `members`.
int ht_pg_subgroup(void* h, const int* members, int n, const char* tag, void** out,
                   char* err, size_t err_len) {
  *out = nullptr;
  return guarded(err, err_len, [&] {
    auto g = static_cast<HtGroup*>(h);
    int sub_rank = -1;
    for (int i = 0; i < n; ++i) {
      if (members[i] == g->rank) sub_rank = i;
    }
    if (sub_rank < 0) {
      throw std::runtime_error("rank " + std::to_string(g->rank) +
                               " is not a member of sub-group " + tag);
    }
    auto s = new HtGroup();
    s->rank = sub_rank;
    s->world = n;
    s->timeout = g->timeout;
    s->store = g->store;
    s->device = g->device;
    s->threads = g->threads;
    try {
      auto gopts = c10d::ProcessGroupGloo::Options::create(g->timeout);
      gopts->devices.push_back(g->device);
      gopts->threads = g->threads;
      auto key = std::string("ht/sub/") + tag;
      auto gstore = c10::make_intrusive<c10d::PrefixStore>(key + "/gloo", g->store);
      auto pg = c10::make_intrusive<c10d::ProcessGroupGloo>(gstore, sub_rank, n, gopts);
      pg->setTimeout(g->timeout);
      s->gloo = pg;
#ifdef HT_USE_NCCL
      if (g->nccl) {
        auto nopts = c10d::ProcessGroupNCCL::Options::create();
        nopts->timeout = g->timeout;
        auto nstore = c10::make_intrusive<c10d::PrefixStore>(key + "/nccl", g->store);
        s->nccl = c10::make_intrusive<c10d::ProcessGroupNCCL>(nstore, sub_rank, n, nopts);
      }
#endif
    } catch (...) {
      delete s;
      throw;
    }
    *out = s;
  });
}

int ht_pg_has_nccl(void* h) {
#ifdef HT_USE_NCCL
  return static_cast<HtGroup*>(h)->nccl ? 1 : 0;
#else
  (void)h;
  return 0;
#endif
}

void ht_pg_destroy(void* h) {
  auto g = static_cast<HtGroup*>(h);
  try {
#ifdef HT_USE_NCCL
    if (g->nccl) g->nccl->shutdown();
#endif
    g->gloo.reset();
    g->store.reset();
  } catch (...) {
  }
  delete g;
}

// Start an in-place SUM all-reduce of one tensor (contiguous, any dtype
// the backend supports).
static c10::intrusive_ptr<c10d::Work> start_allreduce_sum(HtGroup* g, at::Tensor& t) {
  std::vector<at::Tensor> ts{t};
  c10d::AllreduceOptions o;
  o.reduceOp = c10d::ReduceOp::SUM;
  o.timeout = g->timeout;
  return backend_for(g, t).allreduce(ts, o);
}

// Hand a started collective to the caller, who must pass it to
// ht_work_wait exactly once.
static void hand_out(c10::intrusive_ptr<c10d::Work> w, void** work) {
  *work = new c10::intrusive_ptr<c10d::Work>(std::move(w));
}

// In-place SUM all-reduce of one tensor, waited for.
int ht_pg_allreduce_sum(void* h, at::Tensor* t, char* err, size_t err_len) {
  auto g = static_cast<HtGroup*>(h);
  return guarded(err, err_len,
                 [&] { wait_work(start_allreduce_sum(g, *t), g->timeout); });
}

// Start an in-place SUM all-reduce (see hand_out).
int ht_pg_allreduce_sum_async(void* h, at::Tensor* t, void** work, char* err,
                              size_t err_len) {
  auto g = static_cast<HtGroup*>(h);
  *work = nullptr;
  return guarded(err, err_len, [&] { hand_out(start_allreduce_sum(g, *t), work); });
}

int ht_work_wait(void* h, void* work, char* err, size_t err_len) {
  auto g = static_cast<HtGroup*>(h);
  auto w = static_cast<c10::intrusive_ptr<c10d::Work>*>(work);
  int rc = guarded(err, err_len, [&] { wait_work(*w, g->timeout); });
  delete w;
  return rc;
}

// Start an in-place broadcast of one tensor from `root`.
static c10::intrusive_ptr<c10d::Work> start_broadcast(HtGroup* g, at::Tensor& t, int root) {
  std::vector<at::Tensor> ts{t};
  c10d::BroadcastOptions o;
  o.rootRank = root;
  o.timeout = g->timeout;
  return backend_for(g, t).broadcast(ts, o);
}

int ht_pg_broadcast(void* h, at::Tensor* t, int root, char* err, size_t err_len) {
  auto g = static_cast<HtGroup*>(h);
  return guarded(err, err_len,
                 [&] { wait_work(start_broadcast(g, *t, root), g->timeout); });
}

// Start an in-place broadcast from `root` (see hand_out).
int ht_pg_broadcast_async(void* h, at::Tensor* t, int root, void** work, char* err,
                          size_t err_len) {
  auto g = static_cast<HtGroup*>(h);
  *work = nullptr;
  return guarded(err, err_len, [&] { hand_out(start_broadcast(g, *t, root), work); });
}

// outs: world tensors, each shaped like *t.
int ht_pg_allgather(void* h, at::Tensor* t, at::Tensor** outs, char* err,
                    size_t err_len) {
  auto g = static_cast<HtGroup*>(h);
  return guarded(err, err_len, [&] {
    std::vector<at::Tensor> in{*t};
    std::vector<std::vector<at::Tensor>> out(1);
    for (int q = 0; q < g->world; ++q) out[0].push_back(*outs[q]);
    c10d::AllgatherOptions o;
    o.timeout = g->timeout;
    wait_work(backend_for(g, *t).allgather(out, in, o), g->timeout);
  });
}

int ht_pg_barrier(void* h, char* err, size_t err_len) {
  auto g = static_cast<HtGroup*>(h);
  return guarded(err, err_len, [&] {
    c10d::BarrierOptions o;
    o.timeout = g->timeout;
    wait_work(g->gloo->barrier(o), g->timeout);
  });
}

}  // extern "C"

extern "C" {
// Ask ATen for deterministic algorithms (errors on ops that have none).
void ht_set_deterministic(int on) {
  try {
    at::globalContext().setDeterministicAlgorithms(on != 0, /*warn_only=*/true);
  } catch (...) {
  }
}
}

extern "C" {
// c10's own log threshold (0 INFO, 1 WARNING, 2 ERROR, 3 FATAL).
void ht_set_log_level(int level) { FLAGS_caffe2_log_level = level; }
}

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

int64_t steady_ns() {
  return std::chrono::duration_cast<std::chrono::nanoseconds>(
             std::chrono::steady_clock::now().time_since_epoch())
      .count();
}

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
}

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
