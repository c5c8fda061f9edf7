// emulate_math.h (after emulate.h): the f32 math the GPU build does. NVRTC compiles every .cu
// with --use_fast_math (kernels/cuda/src/nvrtc.rs); in NVRTC 13.0's PTX, exp2f is
// ex2.approx.ftz.f32, expf a multiply by log2(e) rounded to f32 then ex2.approx, log2f
// lg2.approx.ftz.f32, logf lg2.approx times ln 2, tanhf tanh.approx.f32, sqrtf and rsqrtf
// sqrt.approx.ftz and rsqrt.approx.ftz. Each instruction is emulated as the exact result moved
// by its worst-case error as the PTX ISA documents it, in a direction a hash of the argument
// fixes (a value always gets the same error; neighbouring values do not share it), with the
// PTX ISA's exact special cases, and subnormal arguments and results flushed where it is .ftz:
//   ex2.approx: 2 ulp from the correctly rounded result (ex2 of ±0 is exactly 1);
//   lg2.approx: absolute 2^-22 for x in (0.5, 2), else relative 2^-22;
//   tanh.approx.f32: relative 2^-11 (|tanh| kept at most 1);
//   sqrt.approx: relative 2^-23; rsqrt.approx: relative 2^-22.9;
//   __fdividef: 2 ulp for |y| in [2^-126, 2^126], else 0 (CUDA C++ Programming Guide).
// Not emulated: the `/` operator (div.approx.ftz, 2 ulp; rcp.approx.ftz for 1/x, 1 ulp) is
// IEEE division here, and a·b + c is not contracted into an fma (fmad=true on the GPU).
#pragma once

namespace emu {
namespace fastmath {

inline bool up(float x) {
    u32 k = emu_f_bits(x);
    k ^= k >> 16;
    k *= 0x7feb352du;
    k ^= k >> 15;
    k *= 0x846ca68bu;
    k ^= k >> 16;
    return k & 1u;
}

inline float ftz(float x) { return std::fabs(x) < FLT_MIN ? std::copysign(0.0f, x) : x; }

// `r` moved `n` ulps away from zero or towards it, never past the largest finite value.
inline float ulps(float r, u32 n, bool away) {
    if (!std::isfinite(r) || r == 0.0f) return r;
    const u32 b = emu_f_bits(r), mag = b & 0x7fffffffu;
    const u32 moved = away ? std::min<u32>(mag + n, 0x7f7fffffu) : (mag > n ? mag - n : 0u);
    return emu_bits_f((b & 0x80000000u) | moved);
}

// The exact value `e` off by the relative error `rel`, up or down, as an f32.
inline float relative(double e, double rel, bool away) { return (float)(e * (away ? 1.0 + rel : 1.0 - rel)); }

inline float ex2(float x) {
    x = ftz(x);
    if (std::isnan(x) || x == INFINITY) return x;
    if (x == -INFINITY) return 0.0f;
    if (x == 0.0f) return 1.0f;
    return ftz(ulps((float)std::exp2((double)x), 2, up(x)));
}

inline float exp(float x) { return ex2(ftz(x * 1.44269504088896341f)); }

inline float lg2(float x) {
    x = ftz(x);
    if (std::isnan(x) || x < 0.0f) return NAN;
    if (x == 0.0f) return -INFINITY;
    if (x == INFINITY) return x;
    const double e = std::log2((double)x);
    if (x > 0.5f && x < 2.0f) return ftz((float)(e + (up(x) ? 0x1p-22 : -0x1p-22)));
    return relative(e, 0x1p-22, up(x));
}

inline float ln(float x) { return ftz(lg2(x) * 0.693147182f); }

inline float tanh_approx(float x) {
    if (std::isnan(x) || std::fabs(x) < FLT_MIN) return x;  // ±0 and subnormals pass through
    const double t = std::tanh((double)x);
    return std::max(-1.0f, std::min(1.0f, relative(t, 0x1p-11, up(x))));
}

inline float sqrt_approx(float x) {
    x = ftz(x);
    if (std::isnan(x) || x < 0.0f) return NAN;
    if (x == 0.0f || x == INFINITY) return x;
    return relative(std::sqrt((double)x), 0x1p-23, up(x));
}

inline float rsqrt_approx(float x) {
    x = ftz(x);
    if (x == 0.0f) return std::copysign(INFINITY, x);
    if (std::isnan(x) || x < 0.0f) return NAN;
    if (x == INFINITY) return 0.0f;
    return ftz(relative(1.0 / std::sqrt((double)x), std::exp2(-22.9), up(x)));
}

inline float fdividef(float x, float y) {
    x = ftz(x);
    y = ftz(y);
    const float ay = std::fabs(y);
    if (ay > 0x1p126f && ay < INFINITY) return std::isinf(x) ? NAN : 0.0f;
    return ftz(ulps((float)((double)x / (double)y), 2, up(x) != up(y)));
}

}  // namespace fastmath
}  // namespace emu

#define exp2f(x) emu::fastmath::ex2(x)
#define expf(x) emu::fastmath::exp(x)
#define __expf(x) emu::fastmath::exp(x)
#define log2f(x) emu::fastmath::lg2(x)
#define __log2f(x) emu::fastmath::lg2(x)
#define logf(x) emu::fastmath::ln(x)
#define __logf(x) emu::fastmath::ln(x)
#define tanhf(x) emu::fastmath::tanh_approx(x)
#define sqrtf(x) emu::fastmath::sqrt_approx(x)
#define rsqrtf(x) emu::fastmath::rsqrt_approx(x)
#define __fdividef(x, y) emu::fastmath::fdividef(x, y)
