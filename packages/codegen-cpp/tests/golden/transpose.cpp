// k0_pw_mul: [96, 64]: buf0 pointwise
// from FX nodes: permute, clone, mul
extern "C" void k0_pw_mul(const float* __restrict__ in_x_1, float* __restrict__ out_buf0) {
  const bool stream = false;
  {
    for (int64_t ib = 0; ib < 64; ib += 32) {
      for (int64_t jb = 0; jb < 96; jb += 16) {
        if (jb + 16 <= 96 && ib + 32 <= 64) {
          alignas(64) float tile0[512];
          ember::transpose_tile<32>(in_x_1 + 96*ib + jb, 96, tile0);
          alignas(64) float row0[512];
          for (int64_t a = 0; a < 16; ++a) {
            const int64_t i0 = jb + a;
            #pragma omp simd
            for (int64_t b = 0; b < 32; ++b) {
              const int64_t i1 = ib + b;
              const float t0 = tile0[32 * a + b];
              const float t1 = 2.0f;
              const float t2 = t0 * t1;
              row0[32 * a + b] = t2;
            }
            ember::store_row<128>(out_buf0 + 64*i0 + ib, row0 + 32 * a, stream);
          }
        }
        else {
          const int64_t je = std::min<int64_t>(jb + 16, 96);
          const int64_t ie = std::min<int64_t>(ib + 32, 64);
          for (int64_t i0 = jb; i0 < je; ++i0) {
            #pragma omp simd
            for (int64_t i1 = ib; i1 < ie; ++i1) {
              const float t3 = in_x_1[i0 + 96*i1];
              const float t4 = 2.0f;
              const float t5 = t3 * t4;
              out_buf0[64*i0 + i1] = t5;
            }
          }
        }
      }
    }
    ember::stream_fence();
  }
}
