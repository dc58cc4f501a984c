// k0_pw_embedding: [2, 4]: buf0 pointwise
// from FX nodes: embedding
extern "C" void k0_pw_embedding(const int64_t* __restrict__ in_i_1, const float* __restrict__ in_w_1, float* __restrict__ out_buf0, int64_t* __restrict__ ember_error) {
  for (int64_t i0 = 0; i0 < 2; ++i0) {
    const int64_t t0 = in_i_1[i0];
    const int64_t t1 = 10;
    const int64_t t2 = 0;
    const int64_t t3 = ember::checked_index(t0, t2, t1, ember_error, 0);
    #pragma omp simd
    for (int64_t i1 = 0; i1 < 4; ++i1) {
      const int64_t t4 = i1 + 4*static_cast<int64_t>(t3);
#ifdef EMBER_DEBUG_BOUNDS
      ember::check_index("k0_pw_embedding", "w_1", t4, -1);
#endif
      const float t5 = in_w_1[t4];
      out_buf0[4*i0 + i1] = t5;
    }
  }
}
