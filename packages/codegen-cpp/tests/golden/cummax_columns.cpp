// k0_scan_cummax: [64] over [100]: buf0 max, buf1 argmax
// from FX nodes: cummax
extern "C" void k0_scan_cummax(const float* __restrict__ in_x_1, float* __restrict__ out_buf0, int64_t* __restrict__ out_buf1) {
  const int64_t ember_blocks = (64 + 64 - 1) / 64;
  for (int64_t ibk = 0; ibk < ember_blocks; ++ibk) {
    const int64_t ib = ibk * 64;
    const int64_t ln = std::min<int64_t>(64, 64 - ib);
    float s_buf0[64];
    int64_t k_buf0[64];
    for (int64_t l = 0; l < 64; ++l) {
      s_buf0[l] = -std::numeric_limits<float>::infinity(); k_buf0[l] = 0;
    }
    float s_buf1[64];
    int64_t k_buf1[64];
    for (int64_t l = 0; l < 64; ++l) {
      s_buf1[l] = -std::numeric_limits<float>::infinity(); k_buf1[l] = 0;
    }
    for (int64_t r0 = 0; r0 < 100; ++r0) {
      #pragma omp simd
      for (int64_t l = 0; l < ln; ++l) {
        const int64_t i0 = ib + l;
        const float t0 = in_x_1[i0 + 64*r0];
        { const bool take = ember::scan_take_max(t0, s_buf0[l]); s_buf0[l] = take ? t0 : s_buf0[l]; k_buf0[l] = take ? r0 : k_buf0[l]; }
        out_buf0[i0 + 64*r0] = s_buf0[l];
        { const bool take = ember::scan_take_max(t0, s_buf1[l]); s_buf1[l] = take ? t0 : s_buf1[l]; k_buf1[l] = take ? r0 : k_buf1[l]; }
        out_buf1[i0 + 64*r0] = k_buf1[l];
      }
    }
  }
}
