//! The emulator's own checks, each on a small kernel written to trip it (and, where a check
//! must not fire, one that must pass): shared memory poisoned at every block's start, two
//! blocks interleaved, cp.async landing at its wait, alignment, warp collectives checking
//! their masks, the fast-math intrinsics' documented errors and flush-to-zero. The planted bugs
//! in the real kernels (`kernel_test_support::mutations`) are the other half. Skips (with the
//! reason) where g++ is missing.

use kernel_cuda::{KernelSource, Launch};
use kernel_test_support::emu::{unavailable, Arg, EmuModule};

/// `code` (the prelude prepended) built for the emulator, or `None` without g++.
fn module(file: &'static str, code: &str, entries: &'static [&'static str]) -> Option<EmuModule> {
    if let Some(why) = unavailable() {
        eprintln!("SKIPPED emulator checks: {why}");
        return None;
    }
    let code: &'static str =
        Box::leak(format!("{}{}", kernel_cuda::PRELUDE, code).into_boxed_str());
    let source = KernelSource {
        family: "emulator-checks",
        file,
        code,
        entries,
    };
    Some(EmuModule::build(&source).unwrap_or_else(|e| panic!("{e}")))
}

fn grid(blocks: u32, threads: u32) -> Launch {
    Launch {
        grid: (blocks, 1, 1),
        block: (threads, 1, 1),
        smem: 0,
    }
}

fn floats(bytes: &[u8]) -> Vec<f32> {
    bytes
        .chunks_exact(4)
        .map(|c| f32::from_le_bytes(c.try_into().unwrap()))
        .collect()
}

fn bytes(values: &[f32]) -> Vec<u8> {
    values.iter().flat_map(|v| v.to_le_bytes()).collect()
}

/// Runs `entry` over `blocks` × `threads` with one f32 input and one f32 output.
fn run(
    m: &EmuModule,
    entry: &str,
    blocks: u32,
    threads: u32,
    input: &[f32],
    outputs: usize,
) -> Result<Vec<f32>, String> {
    let input = bytes(input);
    let mut out = bytes(&vec![-1.0; outputs]);
    m.launch(
        entry,
        grid(blocks, threads),
        &mut [Arg::In(&input), Arg::Out(&mut out)],
    )
    .map_err(|e| e.to_string())?;
    Ok(floats(&out))
}

#[test]
fn an_uninitialised_shared_read_is_nan_in_every_block() {
    // Block 0 writes all 64 shared floats, the others only the first 32: every block's other
    // 32 read the poison, not zeros and not block 0's values.
    let Some(m) = module(
        "emu-poison.cu",
        r#"extern "C" __global__ void poison(const float* in, float* out) {
            __shared__ float s[64];
            const int n = blockIdx.x == 0 ? 64 : 32;
            if ((int)threadIdx.x < n) s[threadIdx.x] = 1.0f;
            __syncthreads();
            out[blockIdx.x * 64 + threadIdx.x] = s[threadIdx.x];
        }"#,
        &["poison"],
    ) else {
        return;
    };
    let out = run(&m, "poison", 4, 64, &[0.0], 4 * 64).unwrap();
    for (i, v) in out.iter().enumerate() {
        let (block, t) = (i / 64, i % 64);
        if block == 0 || t < 32 {
            assert_eq!(*v, 1.0, "block {block} thread {t}");
        } else {
            assert!(
                v.is_nan(),
                "block {block} thread {t} read {v}, not the poison"
            );
        }
    }
}

#[test]
fn two_blocks_run_interleaved_between_barriers() {
    // Thread 0 of each block logs (block, phase) at three barrier-separated phases. One block
    // after another would log 0,1,2 then 10,11,12; two interleaved blocks alternate, the later
    // block first. (On a GPU the log would be a race: that is what it shows.)
    let Some(m) = module(
        "emu-interleave.cu",
        r#"extern "C" __global__ void interleave(const float* in, float* log) {
            for (int phase = 0; phase < 3; ++phase) {
                if (threadIdx.x == 0) {
                    const int at = (int)log[0] + 1;
                    log[at] = (float)(blockIdx.x * 10 + phase);
                    log[0] = (float)at;
                }
                __syncthreads();
            }
        }"#,
        &["interleave"],
    ) else {
        return;
    };
    let input = bytes(&[0.0]);
    let mut log = bytes(&[0.0; 7]);
    m.launch(
        "interleave",
        grid(2, 64),
        &mut [Arg::In(&input), Arg::Out(&mut log)],
    )
    .unwrap();
    assert_eq!(floats(&log), [6.0, 10.0, 0.0, 11.0, 1.0, 12.0, 2.0]);
}

#[test]
fn cp_async_lands_at_its_wait_and_not_before() {
    let Some(m) = module(
        "emu-cp-async.cu",
        r#"extern "C" __global__ void copies(const float* in, float* out) {
            __shared__ __align__(16) float s[8];
            if (threadIdx.x != 0) return;
            cp_async16(&s[0], in, 16);
            cp_async_commit();
            out[0] = s[0];  // in flight
            cp_async16(&s[4], in + 4, 16);
            cp_async_commit();
            cp_async_wait<1>();
            out[1] = s[0];  // landed
            out[2] = s[4];  // the newest group: still in flight
            cp_async_wait<0>();
            out[3] = s[4];
            cp_async16(&s[0], in, 0);  // a 0-byte source: zero-filled
            cp_async_commit();
            cp_async_wait<0>();
            out[4] = s[0];
        }
        extern "C" __global__ void unwaited(const float* in, float* out) {
            __shared__ __align__(16) float s[4];
            cp_async16(&s[0], in, 16);
            cp_async_commit();
        }"#,
        &["copies", "unwaited"],
    ) else {
        return;
    };
    let input: Vec<f32> = (1..=8).map(|i| i as f32).collect();
    let out = run(&m, "copies", 1, 32, &input, 5).unwrap();
    assert!(out[0].is_nan() && out[2].is_nan(), "{out:?}");
    assert_eq!([out[1], out[3], out[4]], [1.0, 5.0, 0.0]);
    let err = run(&m, "unwaited", 1, 32, &input, 1).unwrap_err();
    assert!(err.contains("cp.async copies not waited for"), "{err}");
}

#[test]
fn misaligned_vector_ldmatrix_and_cp_async_addresses_fail() {
    let Some(m) = module(
        "emu-align.cu",
        r#"extern "C" __global__ void vector(const float* in, float* out) {
            const float4 v = *reinterpret_cast<const float4*>(in + threadIdx.x % 2);
            out[threadIdx.x] = v.x;
        }
        extern "C" __global__ void matrix(const float* in, float* out) {
            __shared__ __align__(16) bf16 s[8 * 40];
            for (int i = threadIdx.x; i < 8 * 40; i += 32) s[i] = from_f32<bf16>(1.0f);
            __syncthreads();
            u32 r[4];
            ldmatrix_x4(r, s + (threadIdx.x % 8) * 36);  // rows of 72 bytes
            out[threadIdx.x] = (float)r[0];
        }
        extern "C" __global__ void copy(const float* in, float* out) {
            __shared__ __align__(16) float s[8];
            cp_async16(&s[0], in + 2, 16);
            cp_async_commit();
            cp_async_wait<0>();
        }"#,
        &["vector", "matrix", "copy"],
    ) else {
        return;
    };
    let input = vec![0.0f32; 64];
    for (entry, what) in [
        ("vector", "a pointer cast to an aligned type"),
        ("matrix", "an ldmatrix row address"),
        ("copy", "a cp.async source"),
    ] {
        let err = run(&m, entry, 1, 32, &input, 32).unwrap_err();
        assert!(
            err.contains("misaligned address") && err.contains(what),
            "{entry}: {err}"
        );
    }
}

#[test]
fn warp_collectives_check_only_the_lanes_of_their_mask() {
    let Some(m) = module(
        "emu-masks.cu",
        r#"extern "C" __global__ void half_warp(const float* in, float* out) {
            if (threadIdx.x >= 16) return;
            __syncwarp(0xffffu);
            out[threadIdx.x] = __shfl_xor_sync(0xffffu, (float)threadIdx.x, 1);
        }
        extern "C" __global__ void exited_lane(const float* in, float* out) {
            if (threadIdx.x >= 16) return;
            out[threadIdx.x] = __shfl_xor_sync(0xffffffffu, (float)threadIdx.x, 1);
        }
        extern "C" __global__ void outside(const float* in, float* out) {
            out[threadIdx.x] = __shfl_xor_sync(0xffffu, (float)threadIdx.x, 16);
        }"#,
        &["half_warp", "exited_lane", "outside"],
    ) else {
        return;
    };
    let out = run(&m, "half_warp", 1, 32, &[0.0], 32).unwrap();
    for (lane, v) in out.iter().enumerate().take(16) {
        assert_eq!(*v, (lane ^ 1) as f32);
    }
    let err = run(&m, "exited_lane", 1, 32, &[0.0], 32).unwrap_err();
    assert!(err.contains("exited"), "{err}");
    let err = run(&m, "outside", 1, 32, &[0.0], 32).unwrap_err();
    assert!(err.contains("outside the mask"), "{err}");
}

/// |got − want| in units of the last place of `want` as an f32.
fn ulps(got: f32, want: f64) -> f64 {
    let w = want as f32;
    let ulp = (f32::from_bits(w.abs().to_bits() + 1) - w.abs()) as f64;
    (got as f64 - want).abs() / ulp
}

#[test]
fn fast_math_functions_err_by_their_documented_bounds() {
    let Some(m) = module(
        "emu-fast-math.cu",
        r#"extern "C" __global__ void math(const float* in, float* out) {
            if (threadIdx.x != 0) return;
            for (int i = 0; i < 64; ++i) {
                out[i] = exp2f(in[i]);
                out[64 + i] = tanhf(in[i]);
                out[128 + i] = log2f(in[i] + 4.0f);
                out[192 + i] = expf(in[i] * 8.0f);
            }
            out[256] = in[64] * in[64];  // a subnormal product: flushed to zero
            out[257] = exp2f(in[65]);     // exactly 1
        }"#,
        &["math"],
    ) else {
        return;
    };
    let mut input: Vec<f32> = (0..64).map(|i| (i as f32 - 31.5) * 0.09).collect();
    input.extend([1e-20, 0.0]);
    let out = run(&m, "math", 1, 32, &input, 258).unwrap();
    // |got − exact| is `bound` (relative to `exact`, or absolute), to within f32 rounding.
    let off_by = |got: f32, exact: f64, bound: f64, relative: bool| {
        let err = (got as f64 - exact).abs() / if relative { exact.abs() } else { 1.0 };
        let rounding = if relative { 1.0 } else { exact.abs() } * 2f64.powi(-24);
        (err - bound).abs() <= rounding * 1.01
    };
    let (mut up, mut down) = (0, 0);
    for (i, &x) in input[..64].iter().enumerate() {
        // ex2.approx: the correctly rounded result moved by 2 ulp.
        let e = ulps(out[i], (x as f64).exp2());
        assert!((1.5..=2.5).contains(&e), "exp2f({x}): {e} ulp");
        // tanh.approx.f32: relative error 2^-11.
        let t = (x as f64).tanh();
        assert!(
            off_by(out[64 + i], t, 2f64.powi(-11), true),
            "tanhf({x}): {}",
            out[64 + i]
        );
        if (out[64 + i] as f64).abs() > t.abs() {
            up += 1
        } else {
            down += 1
        }
        // lg2.approx: absolute 2^-22 in (0.5, 2), relative 2^-22 above (arguments 1.2 to 6.8).
        let (y, l) = (x + 4.0, out[128 + i]);
        let relative = y >= 2.0;
        assert!(
            off_by(l, (y as f64).log2(), 2f64.powi(-22), relative),
            "log2f({y}): {l}"
        );
        // expf: ex2.approx of the rounded product x·log2(e): within 2 + |1.16·x| ulp.
        let z = x * 8.0;
        let ee = ulps(out[192 + i], (z as f64).exp());
        assert!(
            ee <= 2.5 + (1.16 * z.abs() as f64).floor(),
            "expf({z}): {ee} ulp"
        );
    }
    assert!(
        up > 16 && down > 16,
        "the error's sign varies with the argument ({up} up, {down} down)"
    );
    assert_eq!(
        out[256], 0.0,
        "1e-20² is subnormal: the GPU's .ftz arithmetic flushes it"
    );
    assert_eq!(out[257], 1.0, "ex2.approx of 0 is exactly 1");
}

#[test]
fn a_deadlock_fails_the_launch() {
    let Some(m) = module(
        "emu-deadlock.cu",
        r#"extern "C" __global__ void deadlock(const float* in, float* out) {
            if (threadIdx.x < 16) __syncwarp();  // waits for lanes 16..31,
            else __syncthreads();                // which wait for lanes 0..15
        }"#,
        &["deadlock"],
    ) else {
        return;
    };
    let err = run(&m, "deadlock", 1, 32, &[0.0], 1).unwrap_err();
    assert!(err.contains("deadlock"), "{err}");
}
