// k0_pw_mul_sigmoid: [8, 512]: buf0 pointwise
// from FX nodes: mul, sigmoid
extern "C" void k0_pw_mul_sigmoid(const float* __restrict__ in_x_1, const float* __restrict__ in_y_1, float* __restrict__ out_buf0) {
  for (int64_t i0 = 0; i0 < 8; ++i0) {
    #pragma omp simd
    for (int64_t i1 = 0; i1 < 512; ++i1) {
      const float t0 = in_x_1[512*i0 + i1];
      const float t1 = in_y_1[i1];
      const float t2 = t0 * t1;
      const float t3 = ember::sigmoid(t2);
      out_buf0[512*i0 + i1] = t3;
    }
  }
}
