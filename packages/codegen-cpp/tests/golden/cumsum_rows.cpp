// k0_scan_cumsum: [64] over [4096]: buf0 sum
// from FX nodes: cumsum
extern "C" void k0_scan_cumsum(const float* __restrict__ in_x_1, float* __restrict__ out_buf0) {
  #pragma omp parallel for
  for (int64_t i0 = 0; i0 < 64; ++i0) {
    double s_buf0;
    s_buf0 = double(0);
    for (int64_t r0 = 0; r0 < 4096; ++r0) {
      const float t0 = in_x_1[4096*i0 + r0];
      const double t1 = static_cast<double>(t0);
      s_buf0 = s_buf0 + t1;
      out_buf0[4096*i0 + r0] = static_cast<float>(s_buf0);
    }
  }
}
