// k0_red_softmax_output: [32] over [100]: buf0 max (local), buf1 sum (local), buf2 pointwise
extern "C" void k0_red_softmax_output(const float* __restrict__ in_w_1, const float* __restrict__ in_x_1, float* __restrict__ out_buf2) {
  const int64_t ember_outer = 32;
  const int64_t ember_inner = 100;
  const bool ember_split = false;  // too little work to split over threads
  auto ember_point = [&](int64_t i0, bool split) {
    // pass over the reduction: buf0
    float a_buf0_0;
    a_buf0_0 = -std::numeric_limits<float>::infinity();
    {
      auto ember_run = [&](int64_t r_lo, int64_t r_hi, float& s_buf0_0) {
        float l_buf0_0[ember::kLanes];
        for (int64_t l = 0; l < ember::kLanes; ++l) {
          l_buf0_0[l] = -std::numeric_limits<float>::infinity();
        }
        {
          for (int64_t rb = r_lo; rb < r_hi; rb += ember::kLanes) {
            const int64_t rn = std::min<int64_t>(ember::kLanes, r_hi - rb);
            #pragma omp simd
            for (int64_t l = 0; l < rn; ++l) {
              const int64_t r0 = rb + l;
              const float t0 = in_x_1[100*i0 + r0];
              l_buf0_0[l] = ember::maximum(l_buf0_0[l], t0);
            }
          }
        }
        for (int64_t l = 0; l < ember::kLanes; ++l) {
          s_buf0_0 = ember::maximum(s_buf0_0, l_buf0_0[l]);
        }
      };
      ember_run(0, 100, a_buf0_0);
    }
    // pass over the reduction: buf1
    float a_buf1_0;
    a_buf1_0 = 0;
    {
      auto ember_run = [&](int64_t r_lo, int64_t r_hi, float& s_buf1_0) {
        float l_buf1_0[ember::kLanes];
        for (int64_t l = 0; l < ember::kLanes; ++l) {
          l_buf1_0[l] = 0;
        }
        {
          for (int64_t rb = r_lo; rb < r_hi; rb += ember::kLanes) {
            const int64_t rn = std::min<int64_t>(ember::kLanes, r_hi - rb);
            #pragma omp simd
            for (int64_t l = 0; l < rn; ++l) {
              const int64_t r0 = rb + l;
              const float t1 = in_x_1[100*i0 + r0];
              const float t2 = a_buf0_0;
              const float t3 = t1 - t2;
              const float t4 = ember::exp(t3);
              l_buf1_0[l] = l_buf1_0[l] + t4;
            }
          }
        }
        for (int64_t l = 0; l < ember::kLanes; ++l) {
          s_buf1_0 = s_buf1_0 + l_buf1_0[l];
        }
      };
      ember_run(0, 100, a_buf1_0);
    }
    // pass over the reduction: buf2
    {
      auto ember_run = [&](int64_t r_lo, int64_t r_hi) {
        {
          for (int64_t rb = r_lo; rb < r_hi; rb += ember::kLanes) {
            const int64_t rn = std::min<int64_t>(ember::kLanes, r_hi - rb);
            #pragma omp simd
            for (int64_t l = 0; l < rn; ++l) {
              const int64_t r0 = rb + l;
              const float t5 = in_x_1[100*i0 + r0];
              const float t6 = a_buf0_0;
              const float t7 = t5 - t6;
              const float t8 = ember::exp(t7);
              const float t9 = a_buf1_0;
              const float t10 = t8 / t9;
              const float t11 = in_w_1[r0];
              const float t12 = t10 * t11;
              out_buf2[100*i0 + r0] = t12;
            }
          }
        }
      };
      ember_run(0, 100);
    }
  };
  if (ember_split) {
    for (int64_t i0 = 0; i0 < 32; ++i0) {
      ember_point(i0, true);
    }
  }
  else {
    for (int64_t i0 = 0; i0 < 32; ++i0) {
      ember_point(i0, false);
    }
  }
}
