// k0_red_to_copy_var_mean: [4] over [8]: buf0 welford (local), buf1 pointwise
// from FX nodes: _to_copy, var_mean, _to_copy_1
extern "C" void k0_red_to_copy_var_mean(const uint16_t* __restrict__ in_x_1, uint16_t* __restrict__ out_buf1) {
  const int64_t ember_outer = 4;
  const int64_t ember_inner = 8;
  const bool ember_split = false;  // too little work to split over threads
  auto ember_point = [&](int64_t i0, bool split) {
    // pass over the reduction: buf0
    float a_buf0_0;
    float a_buf0_1;
    float a_buf0_2;
    a_buf0_0 = 0;
    a_buf0_1 = 0;
    a_buf0_2 = 0;
    {
      auto ember_run = [&](int64_t r_lo, int64_t r_hi, float& s_buf0_0, float& s_buf0_1, float& s_buf0_2) {
        float l_buf0_0[ember::kLanes];
        float l_buf0_1[ember::kLanes];
        float l_buf0_2[ember::kLanes];
        for (int64_t l = 0; l < ember::kLanes; ++l) {
          l_buf0_0[l] = 0;
          l_buf0_1[l] = 0;
          l_buf0_2[l] = 0;
        }
        int64_t ember_chunks = 0;
        {
          const int64_t rm = r_lo + (r_hi - r_lo) / ember::kLanes * ember::kLanes;
          for (int64_t rb = r_lo; rb < rm; rb += ember::kLanes) {
            const double ember_w = 1.0 / double(++ember_chunks);
            #pragma omp simd
            for (int64_t l = 0; l < ember::kLanes; ++l) {
              const int64_t r0 = rb + l;
              const float t0 = ember::bf16_to_float(in_x_1[8*i0 + r0]);
              const float t1 = t0;
              { l_buf0_2[l] = l_buf0_2[l] + 1; const float delta = t1 - l_buf0_0[l]; l_buf0_0[l] = l_buf0_0[l] + delta * float(ember_w); l_buf0_1[l] = l_buf0_1[l] + delta * (t1 - l_buf0_0[l]); }
            }
          }
          if (rm < r_hi) {
            const int64_t rb = rm, rn = r_hi - rm;
            #pragma omp simd
            for (int64_t l = 0; l < rn; ++l) {
              const int64_t r0 = rb + l;
              const float t2 = ember::bf16_to_float(in_x_1[8*i0 + r0]);
              const float t3 = t2;
              { l_buf0_2[l] = l_buf0_2[l] + 1; const float delta = t3 - l_buf0_0[l]; l_buf0_0[l] = l_buf0_0[l] + delta / l_buf0_2[l]; l_buf0_1[l] = l_buf0_1[l] + delta * (t3 - l_buf0_0[l]); }
            }
          }
        }
        #pragma omp simd
        for (int64_t l = 0; l < 8; ++l) {
          ember::welford_combine(l_buf0_0[l], l_buf0_1[l], l_buf0_2[l], l_buf0_0[l + 8], l_buf0_1[l + 8], l_buf0_2[l + 8]);
        }
        #pragma omp simd
        for (int64_t l = 0; l < 4; ++l) {
          ember::welford_combine(l_buf0_0[l], l_buf0_1[l], l_buf0_2[l], l_buf0_0[l + 4], l_buf0_1[l + 4], l_buf0_2[l + 4]);
        }
        #pragma omp simd
        for (int64_t l = 0; l < 2; ++l) {
          ember::welford_combine(l_buf0_0[l], l_buf0_1[l], l_buf0_2[l], l_buf0_0[l + 2], l_buf0_1[l + 2], l_buf0_2[l + 2]);
        }
        ember::welford_combine(l_buf0_0[0], l_buf0_1[0], l_buf0_2[0], l_buf0_0[1], l_buf0_1[1], l_buf0_2[1]);
        ember::welford_combine(s_buf0_0, s_buf0_1, s_buf0_2, l_buf0_0[0], l_buf0_1[0], l_buf0_2[0]);
      };
      ember_run(0, 8, a_buf0_0, a_buf0_1, a_buf0_2);
    }
    // pointwise members over the outer points
    const float t4 = a_buf0_1;
    const float t5 = 7.0f;
    const float t6 = t4 / t5;
    const float t7 = ember::round_bf16(static_cast<float>(t6));
    out_buf1[i0] = ember::float_to_bf16(t7);
  };
  if (ember_split) {
    for (int64_t i0 = 0; i0 < 4; ++i0) {
      ember_point(i0, true);
    }
  }
  else {
    for (int64_t i0 = 0; i0 < 4; ++i0) {
      ember_point(i0, false);
    }
  }
}
