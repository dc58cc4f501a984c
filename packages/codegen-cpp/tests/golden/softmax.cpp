// k0_red_softmax_mul: [32] over [100]: buf0 max (local), buf1 sum (local), buf2 pointwise
// from FX nodes: _softmax, mul
extern "C" void k0_red_softmax_mul(const float* __restrict__ in_w_1, const float* __restrict__ in_x_1, float* __restrict__ out_buf2) {
  const int64_t ember_outer = 32;
  const int64_t ember_inner = 100;
  const bool ember_split = false;  // too little work to split over threads
  auto ember_point = [&](int64_t i0, bool split) {
    float ember_cache0[100];
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
          const int64_t rm = r_lo + (r_hi - r_lo) / ember::kLanes * ember::kLanes;
          for (int64_t rb = r_lo; rb < rm; rb += ember::kLanes) {
            #pragma omp simd
            for (int64_t l = 0; l < ember::kLanes; ++l) {
              const int64_t r0 = rb + l;
              const float t0 = in_x_1[100*i0 + r0];
              l_buf0_0[l] = ember::maximum(l_buf0_0[l], t0);
            }
          }
          if (rm < r_hi) {
            const int64_t rb = rm, rn = r_hi - rm;
            #pragma omp simd
            for (int64_t l = 0; l < rn; ++l) {
              const int64_t r0 = rb + l;
              const float t1 = in_x_1[100*i0 + r0];
              l_buf0_0[l] = ember::maximum(l_buf0_0[l], t1);
            }
          }
        }
        #pragma omp simd
        for (int64_t l = 0; l < 8; ++l) {
          l_buf0_0[l] = ember::maximum(l_buf0_0[l], l_buf0_0[l + 8]);
        }
        #pragma omp simd
        for (int64_t l = 0; l < 4; ++l) {
          l_buf0_0[l] = ember::maximum(l_buf0_0[l], l_buf0_0[l + 4]);
        }
        #pragma omp simd
        for (int64_t l = 0; l < 2; ++l) {
          l_buf0_0[l] = ember::maximum(l_buf0_0[l], l_buf0_0[l + 2]);
        }
        l_buf0_0[0] = ember::maximum(l_buf0_0[0], l_buf0_0[1]);
        s_buf0_0 = ember::maximum(s_buf0_0, l_buf0_0[0]);
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
          const int64_t rm = r_lo + (r_hi - r_lo) / ember::kLanes * ember::kLanes;
          for (int64_t rb = r_lo; rb < rm; rb += ember::kLanes) {
            #pragma omp simd
            for (int64_t l = 0; l < ember::kLanes; ++l) {
              const int64_t r0 = rb + l;
              const float t2 = in_x_1[100*i0 + r0];
              const float t3 = a_buf0_0;
              const float t4 = t2 - t3;
              const float t5 = ember::exp(t4);
              l_buf1_0[l] = l_buf1_0[l] + t5;
              ember_cache0[r0] = t5;
            }
          }
          if (rm < r_hi) {
            const int64_t rb = rm, rn = r_hi - rm;
            #pragma omp simd
            for (int64_t l = 0; l < rn; ++l) {
              const int64_t r0 = rb + l;
              const float t6 = in_x_1[100*i0 + r0];
              const float t7 = a_buf0_0;
              const float t8 = t6 - t7;
              const float t9 = ember::exp(t8);
              l_buf1_0[l] = l_buf1_0[l] + t9;
              ember_cache0[r0] = t9;
            }
          }
        }
        #pragma omp simd
        for (int64_t l = 0; l < 8; ++l) {
          l_buf1_0[l] = l_buf1_0[l] + l_buf1_0[l + 8];
        }
        #pragma omp simd
        for (int64_t l = 0; l < 4; ++l) {
          l_buf1_0[l] = l_buf1_0[l] + l_buf1_0[l + 4];
        }
        #pragma omp simd
        for (int64_t l = 0; l < 2; ++l) {
          l_buf1_0[l] = l_buf1_0[l] + l_buf1_0[l + 2];
        }
        l_buf1_0[0] = l_buf1_0[0] + l_buf1_0[1];
        s_buf1_0 = s_buf1_0 + l_buf1_0[0];
      };
      ember_run(0, 100, a_buf1_0);
    }
    // pass over the reduction: buf2
    {
      auto ember_run = [&](int64_t r_lo, int64_t r_hi) {
        {
          const int64_t rm = r_lo + (r_hi - r_lo) / ember::kLanes * ember::kLanes;
          for (int64_t rb = r_lo; rb < rm; rb += ember::kLanes) {
            #pragma omp simd
            for (int64_t l = 0; l < ember::kLanes; ++l) {
              const int64_t r0 = rb + l;
              const float t10 = ember_cache0[r0];
              const float t11 = in_x_1[100*i0 + r0];
              const float t12 = a_buf0_0;
              const float t13 = t11 - t12;
              const float t14 = a_buf1_0;
              const float t15 = t10 / t14;
              const float t16 = in_w_1[r0];
              const float t17 = t15 * t16;
              out_buf2[100*i0 + r0] = t17;
            }
          }
          if (rm < r_hi) {
            const int64_t rb = rm, rn = r_hi - rm;
            #pragma omp simd
            for (int64_t l = 0; l < rn; ++l) {
              const int64_t r0 = rb + l;
              const float t18 = ember_cache0[r0];
              const float t19 = in_x_1[100*i0 + r0];
              const float t20 = a_buf0_0;
              const float t21 = t19 - t20;
              const float t22 = a_buf1_0;
              const float t23 = t18 / t22;
              const float t24 = in_w_1[r0];
              const float t25 = t23 * t24;
              out_buf2[100*i0 + r0] = t25;
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
