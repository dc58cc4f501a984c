// k0_pw_cat: [4, 8]: buf0 pointwise
// from FX nodes: cat
extern "C" void k0_pw_cat(const float* __restrict__ in_x_1, const float* __restrict__ in_y_1, float* __restrict__ out_buf0) {
  for (int64_t i0 = 0; i0 < 4; ++i0) {
    #pragma omp simd
    for (int64_t i1 = 0; i1 < 8; ++i1) {
      const int64_t t0 = i1;
      const int64_t t1 = 3;
      const bool t2 = t0 < t1;
      const float t3 = t2 ? in_x_1[3*i0 + i1] : 0.0f;
      const bool t4 = t0 >= t1;
      const int64_t t5 = 8;
      const bool t6 = t0 < t5;
      const bool t7 = t4 && t6;
      const float t8 = t7 ? in_y_1[5*i0 + i1 - 3] : 0.0f;
      const float t9 = t2 ? t3 : t8;
      out_buf0[8*i0 + i1] = t9;
    }
  }
}
