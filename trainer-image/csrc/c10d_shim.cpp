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

#include <netdb.h>
#include <sys/socket.h>
#include <unistd.h>

#include <cerrno>
#include <chrono>
#include <cstdint>
#include <cstdlib>
#include <cstring>
#include <string>
#include <thread>
#include <vector>

#include "shim.h"

using namespace ht;

namespace {

// PyTorch's flight recorder (on by default, 2,000 entries) records every
// collective, and registers a process group's status in a map before it
// takes its lock: two threads whose process groups record for the first
// time at once can corrupt that map (seen as a SIGSEGV in
// std::_Rb_tree_insert_and_rebalance under
// FlightRecorder::recordWithResetEnabled, about one run in 40 of the c10d
// test, where two ranks run as threads of one process). The trainer does
// not read its records, so it is off unless TORCH_FR_BUFFER_SIZE is set.
// Set before main, while the process has one thread (setenv is not safe
// beside a concurrent getenv); the recorder reads it on first use.
[[maybe_unused]] const bool kFlightRecorderOff = [] {
  setenv("TORCH_FR_BUFFER_SIZE", "0", /*overwrite=*/0);
  return true;
}();

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

// A listening socket bound to bind_host:port for rank 0's TCPStore, which
// otherwise listens on every address of the host; -1 when bind_host is
// empty. Throws naming the address when it cannot be bound.
int listen_on(const char* bind_host, int port) {
  if (bind_host == nullptr || bind_host[0] == '\0') return -1;
  addrinfo hints{};
  hints.ai_family = AF_UNSPEC;
  hints.ai_socktype = SOCK_STREAM;
  hints.ai_flags = AI_PASSIVE;
  addrinfo* res = nullptr;
  std::string port_s = std::to_string(port);
  if (getaddrinfo(bind_host, port_s.c_str(), &hints, &res) != 0 || res == nullptr) {
    throw std::runtime_error(std::string("HT_BIND_ADDR ") + bind_host +
                             " does not resolve to an address");
  }
  int fd = socket(res->ai_family, res->ai_socktype | SOCK_CLOEXEC, res->ai_protocol);
  int one = 1;
  bool ok = fd >= 0 && setsockopt(fd, SOL_SOCKET, SO_REUSEADDR, &one, sizeof(one)) == 0 &&
            bind(fd, res->ai_addr, res->ai_addrlen) == 0 && listen(fd, 2048) == 0;
  int err = errno;
  freeaddrinfo(res);
  if (!ok) {
    if (fd >= 0) close(fd);
    throw std::runtime_error(std::string("rank 0 cannot listen on ") + bind_host + ":" +
                             port_s + ": " + std::strerror(err));
  }
  return fd;
}

// A star sum in flight (see start_star_sum).
class StarWork : public c10d::Work {
 public:
  StarWork(std::vector<c10::intrusive_ptr<c10d::Work>> parts, std::vector<at::Tensor> keep)
      : Work(-1, c10d::OpType::ALLREDUCE), parts_(std::move(parts)), keep_(std::move(keep)) {}

  // Rank 0: done when its job finishes; elsewhere: when the send and the
  // reply are.
  bool wait(std::chrono::milliseconds timeout) override {
    if (parts_.empty()) return Work::wait(timeout);
    for (auto& w : parts_) wait_work(w, timeout);
    return true;
  }

  using Work::finish;

 private:
  std::vector<c10::intrusive_ptr<c10d::Work>> parts_;
  std::vector<at::Tensor> keep_;  // what the sends read, until they are done
};

// Tags of star sums: above the Reducer's bucket tags (below 2^30).
constexpr uint32_t kStarTag = uint32_t{1} << 30;

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
    // Rank 0's store listens on the pod IP only (HT_BIND_ADDR), like Gloo.
    if (rank == 0) {
      int fd = listen_on(bind_host, master_port);
      if (fd >= 0) opts.masterListenFd = fd;
    }
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

// A star sum: every rank sends its tensor to rank 0, which adds them (in
// rank order, so every run gives the same bits) and sends the sum back.
// For a small tensor this is what an all-reduce costs least: two messages
// on every rank but rank 0, against Gloo's ring all-reduce's 2 (n - 1)
// sends and as many receives, each a wake-up (and on a CPU quota perhaps
// a period's wait). Rank 0 adds and replies on a thread of its own
// (word_worker), as soon as the last tensor is in.

static c10::intrusive_ptr<c10d::Work> start_star_sum(HtGroup* g, at::Tensor& t) {
  if (!t.is_cpu() || !t.is_contiguous()) {
    throw std::runtime_error("a star sum takes a contiguous CPU tensor");
  }
  const int tag = static_cast<int>(kStarTag | (g->star_calls++ % kStarTag));
  auto& gloo = *g->gloo;
  if (g->rank != 0) {
    at::Tensor out = t.clone();
    std::vector<at::Tensor> s{out};
    std::vector<at::Tensor> r{t};
    std::vector<c10::intrusive_ptr<c10d::Work>> parts;
    parts.push_back(gloo.send(s, 0, tag));
    parts.push_back(gloo.recv(r, 0, tag));
    return c10::make_intrusive<StarWork>(std::move(parts), std::vector<at::Tensor>{out});
  }
  auto done = c10::make_intrusive<StarWork>(std::vector<c10::intrusive_ptr<c10d::Work>>{},
                                            std::vector<at::Tensor>{});
  std::vector<c10::intrusive_ptr<c10d::Work>> recvs;
  std::vector<at::Tensor> got;
  for (int peer = 1; peer < g->world; ++peer) {
    std::vector<at::Tensor> r{at::empty_like(t)};
    recvs.push_back(gloo.recv(r, peer, tag));
    got.push_back(r[0]);
  }
  word_worker().post([recvs = std::move(recvs), got = std::move(got), t, done,
                      backend = g->gloo, world = g->world, tag, timeout = g->timeout]() mutable {
    try {
      for (auto& w : recvs) wait_work(w, timeout);
      for (auto& x : got) t.add_(x);
      std::vector<c10::intrusive_ptr<c10d::Work>> sends;
      for (int peer = 1; peer < world; ++peer) {
        std::vector<at::Tensor> s{t};
        sends.push_back(backend->send(s, peer, tag));
      }
      for (auto& w : sends) wait_work(w, timeout);
      done->finish();
    } catch (...) {
      done->finish(std::current_exception());
    }
  });
  return done;
}

// Start an in-place star sum of a small CPU tensor (see hand_out).
int ht_pg_star_sum_async(void* h, at::Tensor* t, void** work, char* err, size_t err_len) {
  auto g = static_cast<HtGroup*>(h);
  *work = nullptr;
  return guarded(err, err_len, [&] { hand_out(start_star_sum(g, *t), work); });
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

// Start a point-to-point send of one tensor to `peer` (see hand_out).
int ht_pg_send_async(void* h, at::Tensor* t, int peer, int tag, void** work, char* err,
                     size_t err_len) {
  auto g = static_cast<HtGroup*>(h);
  *work = nullptr;
  return guarded(err, err_len, [&] {
    std::vector<at::Tensor> ts{*t};
    hand_out(backend_for(g, *t).send(ts, peer, tag), work);
  });
}

// Start a point-to-point receive into one tensor from `peer` (see hand_out).
int ht_pg_recv_async(void* h, at::Tensor* t, int peer, int tag, void** work, char* err,
                     size_t err_len) {
  auto g = static_cast<HtGroup*>(h);
  *work = nullptr;
  return guarded(err, err_len, [&] {
    std::vector<at::Tensor> ts{*t};
    hand_out(backend_for(g, *t).recv(ts, peer, tag), work);
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
