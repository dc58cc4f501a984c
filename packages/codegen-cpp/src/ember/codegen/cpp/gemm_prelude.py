"""The C++ that matmul kernels (ember.codegen.cpp.matmul_loops) call: a float32 product
of one block, and how a product is cut into blocks over the threads.

Appended to a translation unit only where one of its kernels is a matmul. The block
product calls a BLAS `sgemm_` (Fortran interface, 32-bit integers) through a pointer
the runtime sets when it loads the library (`ember_set_sgemm`; torch's own MKL or
OpenBLAS, whichever torch was built with), one call per block, from inside the
kernel's OpenMP region: a BLAS called from a parallel region runs on its calling
thread. Where no pointer was set, or an operand's strides are not a BLAS matrix's (no
unit stride, a leading dimension too short), a portable loop computes the block: the
same sums, slower.

Why blocks of the output rather than ATen's one threaded `addmm`: each thread takes
its own columns of the product (a slice of the weight, which then stays in that
core's cache from call to call) and, once its block is computed, runs the kernel's
epilogue (bias, activation, residual, the gradient's pointwise ops) over the block
while it is still in cache, instead of a second pass over the whole output in another
kernel. On the 2-core development VM (Intel, AVX-512), compiled graphs called
directly (benchmarks/cpu_gemm_blocks.py): 64x512x512 with bias and SiLU 122.7 us
against eager's 134.3 us (ATen's `addmm` and a SiLU pass); 512x256x256 with a bias
alone 200.7 us against 184.8 us, the one case measured slower.
"""

from __future__ import annotations

GEMM_PRELUDE = r"""
#include <vector>
namespace ember {

// Fortran BLAS sgemm: column-major C = alpha op(A) op(B) + beta C.
typedef void (*SgemmFunction)(const char*, const char*, const int*, const int*, const int*,
                              const float*, const float*, const int*, const float*,
                              const int*, const float*, float*, const int*);
static SgemmFunction blas_sgemm = nullptr;  // set by the runtime (ember_set_sgemm)

constexpr int64_t kGemmParallelMin = 1 << 16;  // multiply-adds below which one thread runs
constexpr int64_t kGemmMaxBlockM = 256, kGemmMaxBlockN = 512;  // a block's largest sides

inline bool blas_int(int64_t v) { return v >= 0 && v <= int64_t(0x7fffffff); }

// c (m x n, row-major, leading dimension n) = a (m x k) @ b (k x n), where a's element
// (i, l) is a[i * a_sm + l * a_sk] and b's (l, j) is b[l * b_sk + j * b_sn].
inline void gemm_block(int64_t m, int64_t n, int64_t k, const float* a, int64_t a_sm,
                       int64_t a_sk, const float* b, int64_t b_sk, int64_t b_sn, float* c) {
  if (blas_sgemm != nullptr && blas_int(m) && blas_int(n) && blas_int(k) && m > 0 && n > 0) {
    // row-major c is column-major c^T (n x m) = b^T (n x k) @ a^T (k x m)
    const char* ta = nullptr;
    const char* tb = nullptr;
    int64_t lda = 0, ldb = 0;
    if (b_sn == 1 && b_sk >= n) { ta = "N"; lda = b_sk; }       // b^T: column-major n x k
    else if (b_sk == 1 && b_sn >= k) { ta = "T"; lda = b_sn; }  // b: column-major k x n
    if (a_sk == 1 && a_sm >= k) { tb = "N"; ldb = a_sm; }       // a^T: column-major k x m
    else if (a_sm == 1 && a_sk >= m) { tb = "T"; ldb = a_sk; }  // a: column-major m x k
    if (ta != nullptr && tb != nullptr && blas_int(lda) && blas_int(ldb)) {
      const int im = int(m), in = int(n), ik = int(k), ilda = int(lda), ildb = int(ldb);
      const float one = 1.0f, zero = 0.0f;
      blas_sgemm(ta, tb, &in, &im, &ik, &one, b, &ilda, a, &ildb, &zero, c, &in);
      return;
    }
  }
  for (int64_t i = 0; i < m; ++i) {
    float* row = c + i * n;
    for (int64_t j = 0; j < n; ++j) row[j] = 0.0f;
    for (int64_t l = 0; l < k; ++l) {
      const float x = a[i * a_sm + l * a_sk];
      const float* brow = b + l * b_sk;
      #pragma omp simd
      for (int64_t j = 0; j < n; ++j) row[j] += x * brow[j * b_sn];
    }
  }
}

// How a product of `batch` matrices of m x n (over k) is cut into blocks: first along
// n, one block per thread (each thread then reads only its own columns of b), then
// along m where that leaves threads idle; no block above kGemmMaxBlockM x
// kGemmMaxBlockN (a thread's block stays in its cache for the epilogue). Small
// products are one block per matrix, run on one thread.
struct GemmBlocks {
  int64_t m, n, mb, nb, mcount, ncount, count;
  bool parallel;
  GemmBlocks(int64_t batch, int64_t m_, int64_t n_, int64_t k, int threads) : m(m_), n(n_) {
    parallel = threads > 1 && batch * m * n * k >= kGemmParallelMin;
    const int64_t t = parallel ? threads : 1;
    const int64_t share = ((n + t - 1) / t + 15) / 16 * 16;  // n / t, in whole vectors
    nb = std::min<int64_t>(n, std::min<int64_t>(kGemmMaxBlockN, share));
    nb = std::max<int64_t>(nb, 1);
    ncount = (n + nb - 1) / nb;
    const int64_t rows = std::max<int64_t>(1, (t + batch * ncount - 1) / (batch * ncount));
    mb = std::max<int64_t>(1, std::min<int64_t>(kGemmMaxBlockM, (m + rows - 1) / rows));
    mcount = (m + mb - 1) / mb;
    count = batch * mcount * ncount;
  }
};

// A thread's scratch block, grown as needed and kept for its next kernels.
inline float* gemm_scratch(int64_t elements) {
  static thread_local std::vector<float> scratch;
  if (int64_t(scratch.size()) < elements) scratch.resize(size_t(elements));
  return scratch.data();
}

}  // namespace ember

extern "C" void ember_set_sgemm(void* function) {
  ember::blas_sgemm = reinterpret_cast<ember::SgemmFunction>(function);
}
"""
