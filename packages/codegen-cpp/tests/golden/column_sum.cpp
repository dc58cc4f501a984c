// k0_red_sum: [64] over [100]: buf0 sum
// from FX nodes: sum_1
extern "C" void k0_red_sum(const float* __restrict__ in_x_1, float* __restrict__ out_buf0) {
  const int64_t ember_blocks = (64 + ember::kColumnLanes - 1) / ember::kColumnLanes;
  const int64_t ember_outer = ember_blocks;
  const int64_t ember_inner = 100;
  const bool ember_split = false;  // too little work to split over threads
  auto ember_point = [&](int64_t ib, bool split) {
    const int64_t ln = std::min<int64_t>(ember::kColumnLanes, 64 - ib);
    // pass over the reduction: buf0
    float a_buf0_0[ember::kColumnLanes];
    for (int64_t l = 0; l < ember::kColumnLanes; ++l) {
      a_buf0_0[l] = 0;
    }
    {
      auto ember_run = [&](int64_t r_lo, int64_t r_hi, float* s_buf0_0) {
        for (int64_t r0 = r_lo; r0 < r_hi; ++r0) {
          #pragma omp simd
          for (int64_t l = 0; l < ln; ++l) {
            const int64_t i0 = ib + l;
            const float t0 = in_x_1[i0 + 64*r0];
            s_buf0_0[l] = s_buf0_0[l] + t0;
          }
        }
      };
      ember_run(0, 100, a_buf0_0);
    }
    #pragma omp simd
    for (int64_t l = 0; l < ln; ++l) {
      const int64_t i0 = ib + l;
      out_buf0[i0] = a_buf0_0[l];
    }
  };
  if (ember_split) {
    for (int64_t ibk = 0; ibk < ember_blocks; ++ibk) {
      ember_point(ibk * ember::kColumnLanes, true);
    }
  }
  else {
    for (int64_t ibk = 0; ibk < ember_blocks; ++ibk) {
      ember_point(ibk * ember::kColumnLanes, false);
    }
  }
}
