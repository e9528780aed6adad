"""Attention read through the block tables: each query's keys and values where they lie in the pool, its own row's
columns only, with no gathered copy. A decode row is one query; a prompt chunk's tokens are a query each (the
runner gives each its row's table and its own column: causal by construction).

The gathered path (`kv_cache.gather_blocks`, then batched matmuls) copies every row's blocks up to the step's
longest row into one tensor and attends over all of it, masked: a row of 40 tokens beside one of 400 reads 400
columns, and every column is read three times (the copy's read and write, then the matmul). Measured on the
embedded model's shape (8 rows, 2 key heads of 32, 1 thread, one layer): 9 against 59 us at 20 cached tokens,
22 against 259 us when one row holds 300 tokens and the others 40-180, 45 against 249 at 300 each.

Where the CPU has AVX-512 (and for head sizes 32, 64 and 128 in blocks of 16) every pass is written in 16-wide
vectors: a block's keys are transposed in registers so each query's 16 scores are multiply-adds, the softmax's
exponentials are a polynomial and one `scalef`, and each column's values are loaded once for several query heads.
That took the layer above from 21, 82 and 172 us (the same loops left to the compiler's vectoriser, which is what
other CPUs and sizes still run).

A small C++ operator (`batchscope::paged_decode`), built once per machine with torch's extension builder into
torch's extension cache, in the background thread that makes the compiled graphs (about 15 s here), never in a
step. It is a real operator with a fake (shape-only) implementation, so a compiled decode graph calls it like any
other. Float32 on the CPU only, and only for model families whose attention takes the cache's keys and values as
the cache returns them, with no logit soft-capping or sinks (`supports`); everything else keeps the gathered path.
"""

from __future__ import annotations

import contextlib
import logging
import os
import platform
import shutil
import threading
from collections.abc import Iterator
from pathlib import Path

import torch
from transformers import PreTrainedModel

try:
    import fcntl
except ImportError:  # not POSIX
    fcntl = None  # type: ignore[assignment]

logger = logging.getLogger(__name__)

# Families whose attention layers hand what the cache returns straight to the attention function, without soft-capped
# logits or sinks: checked token for token with `generate` by the families matrix (tests/engine/test_families.py).
FAMILIES = frozenset({"llama", "mistral", "qwen2", "qwen3", "qwen3_moe", "granite", "smollm3", "olmo2", "starcoder2"})

_SOURCE = r"""
#include <ATen/core/Tensor.h>
#include <ATen/ops/empty.h>
#include <torch/library.h>
#include <algorithm>
#include <bit>
#include <cmath>
#include <cstdint>
#include <vector>

namespace {
constexpr int64_t kLanes = 16;  // a block's columns scored at once (the pool's default block size)
constexpr int64_t kMaxDim = 512;  // head sizes up to this take the blocked scores; larger ones, one dot at a time

// e^x for x <= 0 (scores minus their row's largest), in a form the compiler vectorises: 2^(x log2 e) as 2^n * 2^f,
// |f| <= 1/2, 2^f by a degree-6 polynomial (relative error 1e-7 in float32, about an ulp); e^-87 and below give e^-87.
[[gnu::always_inline]] inline float exp_nonpositive(float x) {
  const float t = (x > -87.f ? x : -87.f) * 1.44269504088896341f;
  const float n = __builtin_floorf(t + 0.5f);
  const float f = t - n;
  float p = 1.533757683113548e-4f;
  p = p * f + 1.3399860363059815e-3f;
  p = p * f + 9.6185195343554e-3f;
  p = p * f + 5.5503289975177936e-2f;
  p = p * f + 2.40226466087139e-1f;
  p = p * f + 6.931472056005104e-1f;
  p = p * f + 1.0000000005920204f;
  return p * std::bit_cast<float>((static_cast<int32_t>(n) + 127) << 23);
}

// out[g] = sum over columns c in [lo, hi] of p[g][c - lo] * V[c], for each query group g of one key head.
template <int64_t D>
void weighted_values(const float* vh, const int64_t* table, int64_t block_size, int64_t lo, int64_t hi,
                     const float* p, int64_t n, int64_t groups, float* out) {
  for (int64_t g = 0; g < groups; ++g) {
    float acc[D] = {};
    const float* pg = p + g * n;
    for (int64_t start = lo - lo % block_size; start <= hi; start += block_size) {
      const float* vb = vh + table[start / block_size] * block_size * D;
      for (int64_t c = std::max(start, lo), to = std::min(start + block_size - 1, hi); c <= to; ++c) {
        const float w = pg[c - lo];
        const float* vc = vb + (c - start) * D;
#pragma omp simd
        for (int64_t d = 0; d < D; ++d) acc[d] += w * vc[d];
      }
    }
    std::copy(acc, acc + D, out + g * D);
  }
}

void weighted_values_any(const float* vh, const int64_t* table, int64_t block_size, int64_t lo, int64_t hi,
                         const float* p, int64_t n, int64_t groups, int64_t vdim, float* out) {
  std::fill(out, out + groups * vdim, 0.f);
  for (int64_t start = lo - lo % block_size; start <= hi; start += block_size) {
    const float* vb = vh + table[start / block_size] * block_size * vdim;
    for (int64_t c = std::max(start, lo), to = std::min(start + block_size - 1, hi); c <= to; ++c) {
      const float* vc = vb + (c - start) * vdim;
      for (int64_t g = 0; g < groups; ++g) {
        const float w = p[g * n + (c - lo)];
        float* og = out + g * vdim;
#pragma omp simd
        for (int64_t d = 0; d < vdim; ++d) og[d] += w * vc[d];
      }
    }
  }
}

#if defined(__AVX512F__)
#include <immintrin.h>
#define BATCHSCOPE_AVX512 1

// The 16 rows of a 16x16 block of floats turned into its 16 columns, in registers.
[[gnu::always_inline]] inline void transpose16(__m512 r[16]) {
  __m512 t[16];
  for (int i = 0; i < 16; i += 2) {
    t[i] = _mm512_unpacklo_ps(r[i], r[i + 1]);
    t[i + 1] = _mm512_unpackhi_ps(r[i], r[i + 1]);
  }
  for (int i = 0; i < 16; i += 4) {
    r[i] = _mm512_shuffle_ps(t[i], t[i + 2], _MM_SHUFFLE(1, 0, 1, 0));
    r[i + 1] = _mm512_shuffle_ps(t[i], t[i + 2], _MM_SHUFFLE(3, 2, 3, 2));
    r[i + 2] = _mm512_shuffle_ps(t[i + 1], t[i + 3], _MM_SHUFFLE(1, 0, 1, 0));
    r[i + 3] = _mm512_shuffle_ps(t[i + 1], t[i + 3], _MM_SHUFFLE(3, 2, 3, 2));
  }
  for (int i = 0; i < 16; i += 8) {
    for (int j = 0; j < 4; ++j) {
      t[i + j] = _mm512_shuffle_f32x4(r[i + j], r[i + j + 4], 0x88);
      t[i + j + 4] = _mm512_shuffle_f32x4(r[i + j], r[i + j + 4], 0xdd);
    }
  }
  for (int j = 0; j < 8; ++j) {
    r[j] = _mm512_shuffle_f32x4(t[j], t[j + 8], 0x88);
    r[j + 8] = _mm512_shuffle_f32x4(t[j], t[j + 8], 0xdd);
  }
}

// exp_nonpositive on 16 lanes: 2^n * p(f) with one scalef.
[[gnu::always_inline]] inline __m512 exp_nonpositive16(__m512 x) {
  const __m512 t = _mm512_mul_ps(_mm512_max_ps(x, _mm512_set1_ps(-87.f)), _mm512_set1_ps(1.44269504088896341f));
  const __m512 n = _mm512_roundscale_ps(t, _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC);
  const __m512 f = _mm512_sub_ps(t, n);
  __m512 p = _mm512_set1_ps(1.533757683113548e-4f);
  p = _mm512_fmadd_ps(p, f, _mm512_set1_ps(1.3399860363059815e-3f));
  p = _mm512_fmadd_ps(p, f, _mm512_set1_ps(9.6185195343554e-3f));
  p = _mm512_fmadd_ps(p, f, _mm512_set1_ps(5.5503289975177936e-2f));
  p = _mm512_fmadd_ps(p, f, _mm512_set1_ps(2.40226466087139e-1f));
  p = _mm512_fmadd_ps(p, f, _mm512_set1_ps(6.931472056005104e-1f));
  p = _mm512_fmadd_ps(p, f, _mm512_set1_ps(1.0000000005920204f));
  return _mm512_scalef_ps(p, n);
}

[[gnu::always_inline]] inline __mmask16 lanes_below(int64_t count) {
  return count >= 16 ? static_cast<__mmask16>(0xFFFF) : static_cast<__mmask16>((1u << count) - 1u);
}

// Scores of one block's 16 columns for every query group of a key head: the block's keys transposed in
// registers 16 dimensions at a time, so each group's 16 dot products are 16-wide multiply-adds (8 groups at once).
template <int64_t D>
void block_scores16(const float* kb, const float* qh, int64_t groups, float sc, float* out) {
  for (int64_t g0 = 0; g0 < groups; g0 += 8) {
    const int64_t gn = std::min<int64_t>(8, groups - g0);
    __m512 acc[8];
    for (int g = 0; g < 8; ++g) acc[g] = _mm512_setzero_ps();
    for (int64_t dc = 0; dc < D; dc += 16) {
      __m512 t[16];
      for (int j = 0; j < 16; ++j) t[j] = _mm512_loadu_ps(kb + j * D + dc);
      transpose16(t);
      for (int g = 0; g < 8; ++g) {
        if (g >= gn) break;
        const float* qg = qh + (g0 + g) * D + dc;
        __m512 a = acc[g];
        for (int d = 0; d < 16; ++d) a = _mm512_fmadd_ps(_mm512_set1_ps(qg[d]), t[d], a);
        acc[g] = a;
      }
    }
    for (int g = 0; g < 8; ++g) {
      if (g >= gn) break;
      _mm512_storeu_ps(out + (g0 + g) * 16, _mm512_mul_ps(acc[g], _mm512_set1_ps(sc)));
    }
  }
}

// softmax in place over n scores, 16 at a time.
inline void softmax16(float* s, int64_t n) {
  __m512 top = _mm512_set1_ps(-INFINITY);
  for (int64_t i = 0; i < n; i += 16) {
    const __mmask16 m = lanes_below(n - i);
    top = _mm512_mask_max_ps(top, m, top, _mm512_maskz_loadu_ps(m, s + i));
  }
  const __m512 shift = _mm512_set1_ps(_mm512_reduce_max_ps(top));
  __m512 sum = _mm512_setzero_ps();
  for (int64_t i = 0; i < n; i += 16) {
    const __mmask16 m = lanes_below(n - i);
    const __m512 e = exp_nonpositive16(_mm512_sub_ps(_mm512_maskz_loadu_ps(m, s + i), shift));
    _mm512_mask_storeu_ps(s + i, m, e);
    sum = _mm512_mask_add_ps(sum, m, sum, e);
  }
  const __m512 inverse = _mm512_set1_ps(1.f / _mm512_reduce_add_ps(sum));
  for (int64_t i = 0; i < n; i += 16) {
    const __mmask16 m = lanes_below(n - i);
    _mm512_mask_storeu_ps(s + i, m, _mm512_mul_ps(_mm512_maskz_loadu_ps(m, s + i), inverse));
  }
}

// weighted_values with each column's values loaded once for up to 256 / D groups (their sums in 16 registers).
template <int64_t D>
void weighted_values16(const float* vh, const int64_t* table, int64_t block_size, int64_t lo, int64_t hi,
                       const float* p, int64_t n, int64_t groups, float* out) {
  constexpr int64_t kVectors = D / 16, kGroups = 256 / D;
  for (int64_t g0 = 0; g0 < groups; g0 += kGroups) {
    const int64_t gn = std::min<int64_t>(kGroups, groups - g0);
    __m512 acc[kGroups][kVectors];
    for (int64_t g = 0; g < kGroups; ++g)
      for (int64_t i = 0; i < kVectors; ++i) acc[g][i] = _mm512_setzero_ps();
    for (int64_t start = lo - lo % block_size; start <= hi; start += block_size) {
      const float* vb = vh + table[start / block_size] * block_size * D;
      for (int64_t c = std::max(start, lo), to = std::min(start + block_size - 1, hi); c <= to; ++c) {
        const float* vc = vb + (c - start) * D;
        __m512 v[kVectors];
        for (int64_t i = 0; i < kVectors; ++i) v[i] = _mm512_loadu_ps(vc + 16 * i);
        for (int64_t g = 0; g < kGroups; ++g) {
          if (g >= gn) break;
          const __m512 w = _mm512_set1_ps(p[(g0 + g) * n + (c - lo)]);
          for (int64_t i = 0; i < kVectors; ++i) acc[g][i] = _mm512_fmadd_ps(w, v[i], acc[g][i]);
        }
      }
    }
    for (int64_t g = 0; g < kGroups; ++g) {
      if (g >= gn) break;
      for (int64_t i = 0; i < kVectors; ++i) _mm512_storeu_ps(out + (g0 + g) * D + 16 * i, acc[g][i]);
    }
  }
}

// One row's attention for one key head, all in 16-wide vectors: head sizes 32, 64 and 128, blocks of 16.
template <int64_t D>
void attend16(const float* qh, const float* kh, const float* vh, const int64_t* table, int64_t lo, int64_t hi,
              int64_t groups, float sc, float* scores, float* block, float* oh) {
  const int64_t n = hi - lo + 1;
  for (int64_t start = lo - lo % 16; start <= hi; start += 16) {
    block_scores16<D>(kh + table[start / 16] * 16 * D, qh, groups, sc, block);
    const int64_t from = std::max(start, lo), to = std::min(start + 15, hi);
    const __mmask16 m = static_cast<__mmask16>(lanes_below(to - start + 1) & ~lanes_below(from - start));
    // `scores` has 16 floats before it: the first block's lanes before `lo` are masked, never written.
    for (int64_t g = 0; g < groups; ++g)
      _mm512_mask_storeu_ps(scores + g * n + (start - lo), m, _mm512_loadu_ps(block + g * 16));
  }
  for (int64_t g = 0; g < groups; ++g) softmax16(scores + g * n, n);
  weighted_values16<D>(vh, table, 16, lo, hi, scores, n, groups, oh);
}
#endif

// out[r, h] = softmax(scale * q[r, h] . K[columns of row r]) V over the columns row r may see: from its first real
// column (after a static wave's left padding; within the window when the layer has one) up to its own; a query
// whose range is empty (a padding row) sees its own column alone. Column c of row r is offset c % block_size of
// block tables[r, c / block_size]. Grouped-query heads: query head h reads key head h / (heads / kv_heads).
at::Tensor paged_decode(const at::Tensor& q, const at::Tensor& kpool, const at::Tensor& vpool, const at::Tensor& tables,
                        const at::Tensor& own, const at::Tensor& first, int64_t window, double scale) {
  TORCH_CHECK(q.is_contiguous() && kpool.is_contiguous() && vpool.is_contiguous() && tables.is_contiguous(),
              "paged_decode: contiguous inputs expected");
  const int64_t rows = q.size(0), heads = q.size(1), dim = q.size(2);
  const int64_t kv_heads = kpool.size(0), blocks = kpool.size(1), block_size = kpool.size(2), vdim = vpool.size(3);
  const int64_t groups = heads / kv_heads, table_width = tables.size(1);
  at::Tensor out = at::empty({rows, heads, vdim}, q.options());
  const float* Q = q.data_ptr<float>();
  const float* K = kpool.data_ptr<float>();
  const float* V = vpool.data_ptr<float>();
  const int64_t* T = tables.data_ptr<int64_t>();
  const int64_t* OWN = own.data_ptr<int64_t>();
  const int64_t* FIRST = first.data_ptr<int64_t>();
  float* O = out.data_ptr<float>();
  const float sc = static_cast<float>(scale);
  std::vector<float> scores;
  std::vector<float> transposed(static_cast<size_t>(kMaxDim * kLanes));
  float* kt = transposed.data();
#ifdef BATCHSCOPE_AVX512
  const bool wide = block_size == 16 && dim == vdim && (dim == 32 || dim == 64 || dim == 128);
  std::vector<float> block(static_cast<size_t>(groups * 16));
#endif
  for (int64_t r = 0; r < rows; ++r) {
    const int64_t hi = OWN[r];
    int64_t lo = FIRST[r];
    if (window > 0) lo = std::max(lo, hi - window + 1);
    if (lo > hi) lo = hi;
    const int64_t n = hi - lo + 1;
    scores.resize(static_cast<size_t>(16 + n * groups));
    for (int64_t h = 0; h < kv_heads; ++h) {
      const float* qh = Q + (r * heads + h * groups) * dim;
      const float* kh = K + h * blocks * block_size * dim;
      const float* vh = V + h * blocks * block_size * vdim;
#ifdef BATCHSCOPE_AVX512
      if (wide) {
        float* oh = O + (r * heads + h * groups) * vdim;
        const int64_t* table = T + r * table_width;
        float* s = scores.data() + 16;
        switch (dim) {
          case 32: attend16<32>(qh, kh, vh, table, lo, hi, groups, sc, s, block.data(), oh); break;
          case 64: attend16<64>(qh, kh, vh, table, lo, hi, groups, sc, s, block.data(), oh); break;
          default: attend16<128>(qh, kh, vh, table, lo, hi, groups, sc, s, block.data(), oh);
        }
        continue;
      }
#endif
      // Scores a block at a time: the block's keys transposed into `kt` ([dim][16]), so each group's 16 dot products
      // are 16-wide multiply-adds over the dimensions, with no horizontal sum per dot product.
      for (int64_t start = lo - lo % block_size; start <= hi; start += block_size) {
        const float* kb = kh + T[r * table_width + start / block_size] * block_size * dim;
        const int64_t from = std::max(start, lo), to = std::min(start + block_size - 1, hi);
        if (dim <= kMaxDim && block_size == kLanes) {
          for (int64_t j = 0; j < kLanes; ++j)
            for (int64_t d = 0; d < dim; ++d) kt[d * kLanes + j] = kb[j * dim + d];
          for (int64_t g = 0; g < groups; ++g) {
            const float* qg = qh + g * dim;
            float acc[kLanes] = {};
            for (int64_t d = 0; d < dim; ++d) {
              const float qd = qg[d];
              const float* row = kt + d * kLanes;
#pragma omp simd
              for (int64_t j = 0; j < kLanes; ++j) acc[j] += qd * row[j];
            }
            for (int64_t c = from; c <= to; ++c) scores[g * n + (c - lo)] = acc[c - start] * sc;
          }
        } else {
          for (int64_t c = from; c <= to; ++c) {
            const float* kc = kb + (c - start) * dim;
            for (int64_t g = 0; g < groups; ++g) {
              const float* qg = qh + g * dim;
              float acc = 0.f;
#pragma omp simd reduction(+ : acc)
              for (int64_t d = 0; d < dim; ++d) acc += qg[d] * kc[d];
              scores[g * n + (c - lo)] = acc * sc;
            }
          }
        }
      }
      for (int64_t g = 0; g < groups; ++g) {
        float* s = scores.data() + g * n;
        float top = s[0];
#pragma omp simd reduction(max : top)
        for (int64_t i = 1; i < n; ++i) top = s[i] > top ? s[i] : top;
#pragma omp simd
        for (int64_t i = 0; i < n; ++i) s[i] = exp_nonpositive(s[i] - top);
        float sum = 0.f;
#pragma omp simd reduction(+ : sum)
        for (int64_t i = 0; i < n; ++i) sum += s[i];
        const float inverse = 1.f / sum;
#pragma omp simd
        for (int64_t i = 0; i < n; ++i) s[i] *= inverse;
      }
      float* oh = O + (r * heads + h * groups) * vdim;
      const int64_t* table = T + r * table_width;
      switch (vdim) {  // value sizes known when compiled keep each group's sums in registers
        case 32: weighted_values<32>(vh, table, block_size, lo, hi, scores.data(), n, groups, oh); break;
        case 64: weighted_values<64>(vh, table, block_size, lo, hi, scores.data(), n, groups, oh); break;
        case 128: weighted_values<128>(vh, table, block_size, lo, hi, scores.data(), n, groups, oh); break;
        default: weighted_values_any(vh, table, block_size, lo, hi, scores.data(), n, groups, vdim, oh);
      }
    }
  }
  return out;
}
}  // namespace

TORCH_LIBRARY(batchscope, m) {
  m.def("paged_decode(Tensor q, Tensor kpool, Tensor vpool, Tensor tables, Tensor own, Tensor first, int window, "
        "float scale) -> Tensor");
}
TORCH_LIBRARY_IMPL(batchscope, CPU, m) { m.impl("paged_decode", &paged_decode); }
"""

# `-fno-math-errno` lets `floor` vectorise (no effect on results); on x86, 512-bit vectors where the CPU has them.
_FLAGS = ["-O3", "-march=native", "-fopenmp-simd", "-fno-math-errno"]
if platform.machine() in ("x86_64", "AMD64"):
    _FLAGS.append("-mprefer-vector-width=512")

_NAME = "batchscope_paged_decode"
_lock = threading.Lock()
_state: dict[str, bool] = {}  # "loaded": the operator is registered in this process; "failed": it cannot be


def supports(model: PreTrainedModel) -> bool:
    """Whether this model's steps may read through the tables (once the operator is loaded)."""
    config = model.config.get_text_config()
    return (
        model.device.type == "cpu"
        and model.dtype == torch.float32
        and config.model_type in FAMILIES
        and getattr(config, "attn_logit_softcapping", None) is None
    )


def load() -> bool:
    """Build (once per machine, cached by torch) and load the operator; False, with one warning, when it cannot be
    (no C++ compiler or ninja): steps keep the gathered path."""
    with _lock:
        if "loaded" in _state or "failed" in _state:
            return "loaded" in _state
        try:
            from torch.utils.cpp_extension import load_inline

            _put_ninja_on_path()
            with _builder_lock(_NAME):
                load_inline(_NAME, cpp_sources=_SOURCE, is_python_module=False, extra_cflags=_FLAGS)
        except Exception as exc:  # a machine without g++ or ninja runs the gathered path
            first_line = (str(exc).strip().splitlines() or [""])[0]
            what = "paged decode attention unavailable, steps gather blocks"
            logger.warning("%s: %s: %s", what, type(exc).__name__, first_line)
            _state["failed"] = True
            return False
        torch.library.register_fake("batchscope::paged_decode")(_fake)
        _state["loaded"] = True
        return True


@contextlib.contextmanager
def _builder_lock(name: str) -> Iterator[None]:
    """Hold the machine-wide build lock for extension `name`, clearing the file lock a killed build left behind.

    torch's builder marks a build (and even a load of an up-to-date one) with a `lock` file in the build folder and
    waits, with no end, while that file exists; a process killed meanwhile (Ctrl-C on a first start, a test run cut
    short) leaves it, and every later start's compile then waits forever (seen here: two test workers, 8 minutes,
    idle). An flock on a file beside it is released by the kernel when its holder dies: while we hold it, no other
    process of ours is building, so a `lock` file found then is a dead one's."""
    if fcntl is None:  # not POSIX: a dead build's lock file is left to torch
        yield
        return
    from torch.utils.cpp_extension import _get_build_directory

    folder = Path(_get_build_directory(name, verbose=False))
    with (folder / "batchscope.flock").open("a") as guard:
        fcntl.flock(guard, fcntl.LOCK_EX)  # released when the file closes, or when this process dies
        stale = folder / "lock"
        if stale.exists():
            logger.warning("removing %s, left by a build that was stopped before it finished", stale)
            stale.unlink(missing_ok=True)
        yield


def _put_ninja_on_path() -> None:
    """torch's builder runs `ninja` from PATH: the pip package's (requirements.txt) when none is there, as when
    the virtual environment's Python is run without activating it."""
    if shutil.which("ninja") is None:
        try:
            import ninja
        except ImportError:
            return
        os.environ["PATH"] = os.pathsep.join([ninja.BIN_DIR, os.environ.get("PATH", "")])


def ready() -> bool:
    """Whether the operator is loaded in this process (never waits)."""
    return "loaded" in _state


def _fake(  # noqa: PLR0913  (the operator's own arguments)
    q: torch.Tensor,
    kpool: torch.Tensor,
    vpool: torch.Tensor,
    tables: torch.Tensor,
    own: torch.Tensor,
    first: torch.Tensor,
    window: int,
    scale: float,
) -> torch.Tensor:
    return q.new_empty((q.shape[0], q.shape[1], vpool.shape[3]))


def paged_decode(  # noqa: PLR0913  (the operator's own arguments)
    query: torch.Tensor,
    key_pool: torch.Tensor,
    value_pool: torch.Tensor,
    tables: torch.Tensor,
    own: torch.Tensor,
    first: torch.Tensor,
    window: int | None,
    scale: float,
) -> torch.Tensor:
    """`query` [rows, heads, dim] (one query per row) over the pools `[kv_heads, blocks, block_size, dim]` through
    `tables` [rows, n]; `own` and `first` [rows]: each query's column and its row's first real column. Returns
    `[rows, heads, value dim]`."""
    return torch.ops.batchscope.paged_decode(
        query.contiguous(), key_pool, value_pool, tables, own, first, window or 0, scale
    )
