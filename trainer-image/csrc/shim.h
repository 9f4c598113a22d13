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
#include <cstdint>
#include <cstring>
#include <memory>
#include <stdexcept>
#include <string>

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
