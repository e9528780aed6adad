// batchscope::paged_decode: attention read through the block tables (see paged_decode.py, which builds and loads
// it for the CPU's instruction sets). The AVX-512 passes are compiled only into a build for AVX-512 (__AVX512F__).
#include <ATen/Parallel.h>
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

// One (row, key head) of paged_decode below: the scores of its query groups over the row's columns [lo, hi], their
// softmax, the weighted values. `scores` and `kt` are the caller's scratch (one set per thread).
struct Item {
  const float *Q, *K, *V;
  const int64_t* T;
  float* O;
  int64_t heads, dim, vdim, groups, blocks, block_size, table_width;
  float sc;
  bool wide;
};

void attend_one(const Item& it, int64_t r, int64_t h, int64_t lo, int64_t hi, std::vector<float>& scores, float* kt,
                float* block) {
  const int64_t n = hi - lo + 1, dim = it.dim, vdim = it.vdim, groups = it.groups, block_size = it.block_size;
  if (scores.size() < static_cast<size_t>(16 + n * groups)) scores.resize(static_cast<size_t>(16 + n * groups));
  const float* qh = it.Q + (r * it.heads + h * groups) * dim;
  const float* kh = it.K + h * it.blocks * block_size * dim;
  const float* vh = it.V + h * it.blocks * block_size * vdim;
  const int64_t* table = it.T + r * it.table_width;
  float* oh = it.O + (r * it.heads + h * groups) * vdim;
#ifdef BATCHSCOPE_AVX512
  if (it.wide) {
    float* s = scores.data() + 16;
    switch (dim) {
      case 32: attend16<32>(qh, kh, vh, table, lo, hi, groups, it.sc, s, block, oh); break;
      case 64: attend16<64>(qh, kh, vh, table, lo, hi, groups, it.sc, s, block, oh); break;
      default: attend16<128>(qh, kh, vh, table, lo, hi, groups, it.sc, s, block, oh);
    }
    return;
  }
#else
  (void)block;
#endif
  // Scores a block at a time: the block's keys transposed into `kt` ([dim][16]), so each group's 16 dot products
  // are 16-wide multiply-adds over the dimensions, with no horizontal sum per dot product.
  for (int64_t start = lo - lo % block_size; start <= hi; start += block_size) {
    const float* kb = kh + table[start / block_size] * block_size * dim;
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
        for (int64_t c = from; c <= to; ++c) scores[g * n + (c - lo)] = acc[c - start] * it.sc;
      }
    } else {
      for (int64_t c = from; c <= to; ++c) {
        const float* kc = kb + (c - start) * dim;
        for (int64_t g = 0; g < groups; ++g) {
          const float* qg = qh + g * dim;
          float acc = 0.f;
#pragma omp simd reduction(+ : acc)
          for (int64_t d = 0; d < dim; ++d) acc += qg[d] * kc[d];
          scores[g * n + (c - lo)] = acc * it.sc;
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
  switch (vdim) {  // value sizes known when compiled keep each group's sums in registers
    case 32: weighted_values<32>(vh, table, block_size, lo, hi, scores.data(), n, groups, oh); break;
    case 64: weighted_values<64>(vh, table, block_size, lo, hi, scores.data(), n, groups, oh); break;
    case 128: weighted_values<128>(vh, table, block_size, lo, hi, scores.data(), n, groups, oh); break;
    default: weighted_values_any(vh, table, block_size, lo, hi, scores.data(), n, groups, vdim, oh);
  }
}

// Below this many multiply-adds a step's attention runs on the calling thread: waking torch's other threads and
// joining them costs more than they would save (a decode step of a few short rows takes microseconds).
constexpr int64_t kMinParallelWork = 1 << 18;

// out[r, h] = softmax(scale * q[r, h] . K[columns of row r]) V over the columns row r may see: from its first real
// column (after a static wave's left padding; within the window when the layer has one) up to its own; a query
// whose range is empty (a padding row) sees its own column alone. Column c of row r is offset c % block_size of
// block tables[r, c / block_size]. Grouped-query heads: query head h reads key head h / (heads / kv_heads).
// Each (row, key head) is computed alone, in the same order whichever thread takes it, so the result does not
// depend on the thread count (torch's, `at::parallel_for`); thread t takes items t, t + threads, ... (a row's key
// heads cost the same, so ragged rows still split evenly).
at::Tensor paged_decode(const at::Tensor& q, const at::Tensor& kpool, const at::Tensor& vpool, const at::Tensor& tables,
                        const at::Tensor& own, const at::Tensor& first, int64_t window, double scale) {
  TORCH_CHECK(q.is_contiguous() && kpool.is_contiguous() && vpool.is_contiguous() && tables.is_contiguous(),
              "paged_decode: contiguous inputs expected");
  const int64_t rows = q.size(0), heads = q.size(1), dim = q.size(2);
  const int64_t kv_heads = kpool.size(0), vdim = vpool.size(3);
  at::Tensor out = at::empty({rows, heads, vdim}, q.options());
  const int64_t* OWN = own.data_ptr<int64_t>();
  const int64_t* FIRST = first.data_ptr<int64_t>();
  Item it{q.data_ptr<float>(), kpool.data_ptr<float>(), vpool.data_ptr<float>(), tables.data_ptr<int64_t>(),
          out.data_ptr<float>(), heads, dim, vdim, heads / kv_heads, kpool.size(1), kpool.size(2), tables.size(1),
          static_cast<float>(scale), false};
#ifdef BATCHSCOPE_AVX512
  it.wide = it.block_size == 16 && dim == vdim && (dim == 32 || dim == 64 || dim == 128);
#endif
  std::vector<int64_t> los(static_cast<size_t>(rows)), his(static_cast<size_t>(rows));
  int64_t work = 0;
  for (int64_t r = 0; r < rows; ++r) {
    const int64_t hi = OWN[r];
    int64_t lo = FIRST[r];
    if (window > 0) lo = std::max(lo, hi - window + 1);
    if (lo > hi) lo = hi;
    los[r] = lo;
    his[r] = hi;
    work += (hi - lo + 1) * heads * (dim + vdim);
  }
  const int64_t items = rows * kv_heads;
  const int64_t threads = work < kMinParallelWork ? 1 : std::min<int64_t>(at::get_num_threads(), items);
  at::parallel_for(0, threads, 1, [&](int64_t begin, int64_t end) {
    std::vector<float> scores;
    std::vector<float> transposed(static_cast<size_t>(kMaxDim * kLanes));
    std::vector<float> block(static_cast<size_t>(it.groups * 16));
    for (int64_t t = begin; t < end; ++t)
      for (int64_t item = t; item < items; item += threads) {
        const int64_t r = item / kv_heads, h = item % kv_heads;
        attend_one(it, r, h, los[r], his[r], scores, transposed.data(), block.data());
      }
  });
  return out;
}
}  // namespace

TORCH_LIBRARY(batchscope, m) {
  m.def("paged_decode(Tensor q, Tensor kpool, Tensor vpool, Tensor tables, Tensor own, Tensor first, int window, "
        "float scale) -> Tensor");
}
TORCH_LIBRARY_IMPL(batchscope, CPU, m) { m.impl("paged_decode", &paged_decode); }
