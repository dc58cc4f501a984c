// k0_pw_index_put: [20]: buf0 pointwise
// from FX nodes: index_put
extern "C" void k0_pw_index_put(const float* __restrict__ in_x_1, float* __restrict__ out_buf0) {
  #pragma omp simd
  for (int64_t i0 = 0; i0 < 20; ++i0) {
    const float t0 = in_x_1[i0];
    out_buf0[i0] = t0;
  }
}

// k1_scatter_index_put: [3, 4]: buf1 scatter
// from FX nodes: index_put
extern "C" void k1_scatter_index_put(float* __restrict__ out_buf0, const int64_t* __restrict__ in_i_1, const float* __restrict__ in_v_1, float* __restrict__ out_buf1, int64_t* __restrict__ ember_error) {
  for (int64_t i0 = 0; i0 < 3; ++i0) {
    for (int64_t i1 = 0; i1 < 4; ++i1) {
      const float t0 = in_v_1[4*i0 + i1];
      const int64_t t1 = in_i_1[i0];
      const int64_t t2 = 5;
      const int64_t t3 = -5;
      const int64_t t4 = ember::checked_index(t1, t3, t2, ember_error, 0);
      const int64_t t5 = 0;
      const bool t6 = t4 < t5;
      const int64_t t7 = t4 + t2;
      const int64_t t8 = t6 ? t7 : t4;
      const int64_t at = i1 + 4*static_cast<int64_t>(t8);
#ifdef EMBER_DEBUG_BOUNDS
      ember::check_index("k1_scatter_index_put", "buf0", at, -1);
#endif
      #pragma omp atomic
      out_buf0[at] += t0;
    }
  }
}
