// k0_pw_output: [96, 64]: buf0 pointwise
extern "C" void k0_pw_output(const float* __restrict__ in_x_1, float* __restrict__ out_buf0) {
  for (int64_t jb = 0; jb < 96; jb += 32) {
    for (int64_t ib = 0; ib < 64; ib += 32) {
      const int64_t je = std::min<int64_t>(jb + 32, 96);
      const int64_t ie = std::min<int64_t>(ib + 32, 64);
      for (int64_t i0 = jb; i0 < je; ++i0) {
        #pragma omp simd
        for (int64_t i1 = ib; i1 < ie; ++i1) {
          const float t0 = in_x_1[i0 + 96*i1];
          const float t1 = 2.0f;
          const float t2 = t0 * t1;
          out_buf0[64*i0 + i1] = t2;
        }
      }
    }
  }
}
