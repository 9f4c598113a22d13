// shim.h: what the C++ shim's files share — the process-group handle the
// Rust side holds, and the helpers that keep C++ exceptions from crossing
// the C ABI (every entry point reports errors as text in a caller-provided
// buffer).
#pragma once

#include <torch/csrc/distributed/c10d/ProcessGroupGloo.hpp>
#include <torch/csrc/distributed/c10d/Store.hpp>
#ifdef HT_USE_NCCL
#include <torch/csrc/distributed/c10d/ProcessGroupNCCL.hpp>
#endif

#include <algorithm>
#include <chrono>
#include <condition_variable>
#include <cstdint>
#include <cstring>
#include <deque>
#include <functional>
#include <memory>
#include <mutex>
#include <stdexcept>
#include <string>
#include <thread>

namespace ht {

struct HtGroup {
  int rank;
  int world;
  std::chrono::milliseconds timeout;
  c10::intrusive_ptr<c10d::Store> store;
  c10::intrusive_ptr<c10d::Backend> gloo;
  // How the Gloo group was built, for sub-groups of it.
  std::shared_ptr<::gloo::transport::Device> device;
  int threads = 2;
  // Star sums started so far (their message tags; every member starts
  // them in the same order).
  uint32_t star_calls = 0;
#ifdef HT_USE_NCCL
  c10::intrusive_ptr<c10d::Backend> nccl;
#endif
};

inline void set_err(char* err, size_t len, const std::string& msg) {
  if (err == nullptr || len == 0) return;
  size_t n = std::min(len - 1, msg.size());
  std::memcpy(err, msg.data(), n);
  err[n] = '\0';
}

// Keep only the first line of c10d's (often multi-line, stack-laden) messages.
inline std::string first_line(const std::string& s) {
  auto pos = s.find('\n');
  return pos == std::string::npos ? s : s.substr(0, pos);
}

template <typename F>
inline int guarded(char* err, size_t len, F&& f) {
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

inline void wait_work(const c10::intrusive_ptr<c10d::Work>& work,
               std::chrono::milliseconds timeout) {
  if (!work->wait(timeout)) {
    throw std::runtime_error("collective did not complete within " +
                             std::to_string(timeout.count()) + " ms");
  }
}

// One long-lived thread that runs posted jobs in order. A thread started
// per job costs every call a clone, a stack and thread-local set-up:
// system work that a rank on a fraction of a core pays in wall time.
class Worker {
 public:
  Worker() { std::thread([this] { run(); }).detach(); }

  void post(std::function<void()> job) {
    {
      std::lock_guard<std::mutex> lock(mu_);
      jobs_.push_back(std::move(job));
    }
    cv_.notify_one();
  }

 private:
  [[noreturn]] void run() {
    for (;;) {
      std::function<void()> job;
      {
        std::unique_lock<std::mutex> lock(mu_);
        cv_.wait(lock, [this] { return !jobs_.empty(); });
        job = std::move(jobs_.front());
        jobs_.pop_front();
      }
      job();
    }
  }

  std::mutex mu_;
  std::condition_variable cv_;
  std::deque<std::function<void()>> jobs_;
};

// The Reducer's comm hooks: their waits, sums and updates, bucket after
// bucket in launch order (the order is the same on every rank, and a
// bucket's work waits only for the peers' messages of that bucket, which
// their hooks send, and for their work on earlier buckets: no cycle).
// Never destroyed: the thread may still wait on it at exit.
inline Worker& hook_worker() {
  static Worker* w = new Worker();
  return *w;
}

// The control word's sums on the root of a star sum (c10d_shim.cpp): a
// thread of their own, so that a word that waits for a slow rank never
// holds up a gradient bucket on the hooks' worker.
inline Worker& word_worker() {
  static Worker* w = new Worker();
  return *w;
}

inline c10d::Backend& backend_for(HtGroup* g, const at::Tensor& t) {
#ifdef HT_USE_NCCL
  if (g->nccl && t.is_cuda()) return *g->nccl;
#endif
  (void)t;
  return *g->gloo;
}

// The SGD update of one range in one pass over float32 CPU elements
// (update_kernel.cpp): g plus `sum` (when given, stored back into g), then
// SGD with the coefficients of optim.rs; `parallel`: on ATen's intra-op
// threads (never from a comm hook's thread, which would start a thread
// team of its own beside the rank's). False: not contiguous float32 CPU
// tensors of one length (nothing was touched).
bool fused_sgd(const double* c, size_t nc, at::Tensor& p, at::Tensor& g, const at::Tensor* sum,
               at::Tensor& m, bool parallel);

// Monotonic nanoseconds, for the trainer's compute/wait split.
inline int64_t steady_ns() {
  return std::chrono::duration_cast<std::chrono::nanoseconds>(
             std::chrono::steady_clock::now().time_since_epoch())
      .count();
}

}  // namespace ht
