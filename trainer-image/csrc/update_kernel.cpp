// update_kernel.cpp: the SGD update (optim.rs, Optimizer::update) over
// float32 elements in one pass. The whole-tensor form reads and writes
// every element once per op (four passes and a temporary); here each
// element goes through the same float ops in the same order, so the result
// is the same bit for bit (the trainer's unit test compares them). Built
// with -ffp-contract=off (no fused multiply-add) and without fast-math:
// every op is one IEEE-rounded float op, whichever instruction set the
// clone below runs on. AdamW stays with the tensor ops: ATen's vectorized
// float sqrt is not the IEEE one on every CPU (one ulp apart on an AVX-512
// machine), and the one-process run and the update inside backward must
// agree bit for bit.
#include "shim.h"

#include <ATen/Parallel.h>

#include <cmath>

namespace {

// x86-64: one clone per vector width, picked at load time; elsewhere the
// compiler's baseline.
#if defined(__x86_64__) && (defined(__GNUC__) || defined(__clang__))
#define HT_CLONES __attribute__((target_clones("avx512f", "avx2", "default")))
#else
#define HT_CLONES
#endif

// SGD: g (+ s), then g + wd·p, m = m·momentum + g, p = p + m·(−lr).
HT_CLONES void sgd_kernel(int64_t n, float* __restrict p, float* __restrict g,
                          const float* __restrict s, float* __restrict m, float wd, float mom,
                          float neg_lr, bool decay, bool momentum) {
  for (int64_t i = 0; i < n; ++i) {
    float gi = g[i];
    if (s) {
      gi = gi + s[i];
      g[i] = gi;
    }
    if (decay) gi = gi + p[i] * wd;
    if (momentum) {
      const float mi = m[i] * mom + gi;
      m[i] = mi;
      p[i] = p[i] + mi * neg_lr;
    } else {
      p[i] = p[i] + gi * neg_lr;
    }
  }
}

bool fits(const at::Tensor& t, int64_t n) {
  return t.defined() && t.is_cpu() && t.scalar_type() == at::kFloat && t.is_contiguous() &&
         t.numel() == n;
}

}  // namespace

namespace ht {

bool fused_sgd(const double* c, size_t nc, at::Tensor& p, at::Tensor& g, const at::Tensor* sum,
               at::Tensor& m, bool parallel) {
  const int64_t n = p.numel();
  if (nc != 3) return false;
  if (!fits(p, n) || !fits(g, n) || !fits(m, n) || (sum && !fits(*sum, n))) return false;
  float* P = p.data_ptr<float>();
  float* G = g.data_ptr<float>();
  float* M = m.data_ptr<float>();
  const float* S = sum ? sum->const_data_ptr<float>() : nullptr;
  const float wd = static_cast<float>(c[0]);
  const float mom = static_cast<float>(c[1]);
  const float neg_lr = static_cast<float>(c[2]);
  // Elements are independent: any split of the range gives the same bits.
  auto run = [&](int64_t b, int64_t e) {
    sgd_kernel(e - b, P + b, G + b, S ? S + b : nullptr, M + b, wd, mom, neg_lr, c[0] != 0.0,
               c[1] != 0.0);
  };
  if (parallel) {
    at::parallel_for(0, n, at::internal::GRAIN_SIZE, run);
  } else {
    run(0, n);
  }
  return true;
}

}  // namespace ht

extern "C" {

// The SGD update of one range (optim.rs): p, g, m of equal length; c the
// step's three coefficients. *applied = 0 when the tensors are not
// contiguous float32 on the CPU (the caller then runs the ATen ops).
int ht_sgd_fused(at::Tensor* p, at::Tensor* g, at::Tensor* m, const double* c, size_t nc,
                 int* applied, char* err, size_t err_len) {
  *applied = 0;
  return ht::guarded(err, err_len, [&] {
    at::NoGradGuard no_grad;
    *applied = ht::fused_sgd(c, nc, *p, *g, nullptr, *m, true) ? 1 : 0;
  });
}
}
