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
      gopts->devices.push_back(make_device(bind_host, iface));
      gopts->threads = gloo_threads > 0 ? gloo_threads : 2;
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

// In-place SUM all-reduce of one tensor (contiguous, any dtype gloo supports).
int ht_pg_allreduce_sum(void* h, at::Tensor* t, char* err, size_t err_len) {
  auto g = static_cast<HtGroup*>(h);
  return guarded(err, err_len, [&] {
    std::vector<at::Tensor> ts{*t};
    c10d::AllreduceOptions o;
    o.reduceOp = c10d::ReduceOp::SUM;
    o.timeout = g->timeout;
    wait_work(backend_for(g, *t).allreduce(ts, o), g->timeout);
  });
}

// Start an in-place SUM all-reduce; the returned work handle must be passed
// to ht_work_wait exactly once.
int ht_pg_allreduce_sum_async(void* h, at::Tensor* t, void** work, char* err,
                              size_t err_len) {
  auto g = static_cast<HtGroup*>(h);
  *work = nullptr;
  return guarded(err, err_len, [&] {
    std::vector<at::Tensor> ts{*t};
    c10d::AllreduceOptions o;
    o.reduceOp = c10d::ReduceOp::SUM;
    o.timeout = g->timeout;
    auto w = backend_for(g, *t).allreduce(ts, o);
    *work = new c10::intrusive_ptr<c10d::Work>(std::move(w));
  });
}

int ht_work_wait(void* h, void* work, char* err, size_t err_len) {
  auto g = static_cast<HtGroup*>(h);
  auto w = static_cast<c10::intrusive_ptr<c10d::Work>*>(work);
  int rc = guarded(err, err_len, [&] { wait_work(*w, g->timeout); });
  delete w;
  return rc;
}

int ht_pg_broadcast(void* h, at::Tensor* t, int root, char* err, size_t err_len) {
  auto g = static_cast<HtGroup*>(h);
  return guarded(err, err_len, [&] {
    std::vector<at::Tensor> ts{*t};
    c10d::BroadcastOptions o;
    o.rootRank = root;
    o.timeout = g->timeout;
    wait_work(backend_for(g, *t).broadcast(ts, o), g->timeout);
  });
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

void allreduce_staged(HtGroup* g, at::Tensor& t) {
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
