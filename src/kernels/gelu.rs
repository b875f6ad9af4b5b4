//! GELU on the CPU backends, vectorized.
//!
//! burn's CPU backends evaluate the exact GELU `x Φ(x) = x (1 + erf(x / √2)) / 2` with a scalar
//! libm `erf` per element (flex forward and backward; ndarray forward, its backward being the
//! tanh approximation's derivative); a `perf` profile of `vramfit bench train -c
//! 12gb --backends flex` put 21% of all training time in `erff`/`erfc2` and 5% in scalar `expf`
//! (README, "CPU speed"). This module computes the same function with a branch-free formula that
//! the compiler vectorizes, dispatched at run time to AVX-512 or AVX2 + FMA where the CPU has them:
//!
//! ```text
//! z    = |x| / √2
//! t    = 1 / (1 + p z)
//! erfc = t (a1 + t (a2 + t (a3 + t (a4 + t a5)))) exp(-z²)    Abramowitz & Stegun 7.1.26,
//!                                                             |error in erf| <= 1.5e-7
//! Φ(x) = 1 - erfc / 2  for x >= 0,   erfc / 2  for x < 0
//! gelu(x)  = x Φ(x)
//! gelu'(x) = Φ(x) + x φ(x),  φ(x) = exp(-x² / 2) / √(2π) = exp(-z²) / √(2π)
//! ```
//!
//! One `exp` serves both the CDF and the density. `exp` itself is the Cephes `expf` polynomial
//! with range reduction by `2^k`, written so that it vectorizes (no libm call). Measured against
//! burn's exact GELU on the same inputs (`gelu_matches_exact_form` in this module's tests): the
//! largest absolute difference over `[-10, 10]` is 4.8e-7 for the value and 3.0e-7 for the
//! derivative (bound: [`MAX_ABS_ERROR`]).
//!
//! The op is a burn backend extension ([`CpuGelu`]) for `Flex`, `NdArray` and `Autodiff` of
//! either, with a hand-written backward that recomputes nothing it does not need and, like burn's
//! own GELU, is memory-bound for gradient checkpointing (the input is kept or recomputed, never
//! the output). GPU devices and non-f32 tensors take burn's GELU unchanged: [`gelu`] decides.
// burn-ndarray is deprecated upstream, but it is the CPU fallback users asked for.
#![allow(deprecated)]

use std::marker::PhantomData;

#[cfg(not(target_arch = "wasm32"))]
use burn::backend::NdArray;
use burn::backend::autodiff::checkpoint::base::Checkpointer;
use burn::backend::autodiff::checkpoint::retro_forward::RetroForward;
use burn::backend::autodiff::checkpoint::state::BackwardStates;
use burn::backend::autodiff::checkpoint::strategy::CheckpointStrategy;
use burn::backend::autodiff::grads::Gradients;
use burn::backend::autodiff::ops::{Backward, Ops, OpsKind, unary};
use burn::backend::autodiff::{Autodiff, NodeId};
use burn::backend::ops::ActivationOps;
use burn::backend::tensor::FloatTensor;
use burn::backend::{Backend, Dispatch, DispatchDevice, Flex, backend_extension};
use burn::tensor::{DType, Tensor};
use rayon::prelude::*;

/// Largest absolute difference from the exact GELU (forward, and backward for a unit gradient)
/// accepted by the tests, over inputs in `[-10, 10]`.
pub const MAX_ABS_ERROR: f32 = 1e-6;

/// GELU of `x` (exact form, `x Φ(x)`), vectorized on the CPU backends for f32.
///
/// # Shapes
/// Any shape; the output has the input's shape, dtype and device.
///
/// Tensors on a GPU device, or in another dtype than f32, go to burn's `gelu` unchanged.
pub fn gelu<const D: usize>(x: Tensor<D>) -> Tensor<D> {
    if x.dtype() != DType::F32 || !runs_on_cpu_backend(&x.device()) {
        return burn::tensor::activation::gelu(x);
    }
    Tensor::from_dispatch(<Dispatch as CpuGelu>::cpu_gelu(x.into_dispatch()))
}

/// Whether `device` (or the device an autodiff device wraps) is burn's flex or ndarray backend
/// (the web build has no ndarray: see [`crate::device::CpuBackend`]).
pub(crate) fn runs_on_cpu_backend(device: &burn::tensor::Device) -> bool {
    match device.clone().inner().as_dispatch() {
        DispatchDevice::Flex(_) => true,
        #[cfg(not(target_arch = "wasm32"))]
        DispatchDevice::NdArray(_) => true,
        _ => false,
    }
}

/// The backend extension: GELU forward and its input gradient on the CPU backends.
#[backend_extension(Flex, NdArray: cfg(not(target_arch = "wasm32")), Autodiff)]
pub trait CpuGelu: Backend {
    /// `gelu(x)` elementwise. Shapes: any -> same.
    fn cpu_gelu(x: FloatTensor<Self>) -> FloatTensor<Self>;
    /// `grad * gelu'(x)` elementwise. Shapes: `x` and `grad` the same -> same.
    fn cpu_gelu_backward(x: FloatTensor<Self>, grad: FloatTensor<Self>) -> FloatTensor<Self>;
}

impl CpuGelu for Flex {
    fn cpu_gelu(x: FloatTensor<Self>) -> FloatTensor<Self> {
        if x.dtype() != DType::F32 {
            return Flex::gelu(x);
        }
        flex::map(&[x], |inputs, out| gelu_f32(inputs[0], out))
    }

    fn cpu_gelu_backward(x: FloatTensor<Self>, grad: FloatTensor<Self>) -> FloatTensor<Self> {
        if x.dtype() != DType::F32 || grad.dtype() != DType::F32 {
            return Flex::gelu_backward(x, grad);
        }
        flex::map(&[x, grad], |inputs, out| gelu_backward_f32(inputs[0], inputs[1], out))
    }
}

#[cfg(not(target_arch = "wasm32"))]
impl CpuGelu for NdArray {
    fn cpu_gelu(x: FloatTensor<Self>) -> FloatTensor<Self> {
        match ndarray_f32::map(&[&x], |inputs, out| gelu_f32(inputs[0], out)) {
            Some(out) => out,
            None => NdArray::gelu(x),
        }
    }

    fn cpu_gelu_backward(x: FloatTensor<Self>, grad: FloatTensor<Self>) -> FloatTensor<Self> {
        match ndarray_f32::map(&[&x, &grad], |inputs, out| gelu_backward_f32(inputs[0], inputs[1], out)) {
            Some(out) => out,
            None => NdArray::gelu_backward(x, grad),
        }
    }
}

/// Recomputes the GELU output from its input when gradient checkpointing dropped it.
#[derive(Debug)]
struct RetroGelu<B> {
    input_id: NodeId,
    backend: PhantomData<B>,
}

impl<B: Backend + CpuGelu> RetroForward for RetroGelu<B> {
    fn forward(&self, states: &mut BackwardStates, out_node: NodeId) {
        let input = states.get_state::<B::FloatTensorPrimitive>(&self.input_id);
        states.save(out_node, B::cpu_gelu(input));
    }
}

/// The backward step: the input gradient is `grad * gelu'(x)`; the state is the input's node.
#[derive(Debug)]
struct GeluBackward;

impl<B: Backend + CpuGelu> Backward<B, 1> for GeluBackward {
    type State = NodeId;

    fn backward(self, ops: Ops<Self::State, 1>, grads: &mut Gradients, checkpointer: &mut Checkpointer) {
        let input = checkpointer.retrieve_node_output(ops.state);
        unary::<B, _>(ops.parents, ops.node, grads, |grad| B::cpu_gelu_backward(input, grad));
    }
}

impl<B: Backend + CpuGelu, C: CheckpointStrategy> CpuGelu for Autodiff<B, C> {
    /// Mirrors burn-autodiff's own `gelu`: memory-bound, the input checkpointed.
    fn cpu_gelu(x: FloatTensor<Self>) -> FloatTensor<Self> {
        let retro = RetroGelu::<B> { input_id: x.id(), backend: PhantomData };
        match GeluBackward.prepare::<C>([x.node()]).memory_bound().retro_forward(retro).parents([&x]).stateful() {
            OpsKind::Tracked(mut prep) => {
                let state = prep.checkpoint(&x);
                prep.finish(state, B::cpu_gelu(x.primitive().clone()))
            }
            OpsKind::UnTracked(prep) => prep.finish(B::cpu_gelu(x.into_primitive())),
        }
    }

    /// burn's default `gelu_backward` as differentiable ops. Training never calls this (the
    /// backward step above calls the inner backend's kernel); its values are the derivative of
    /// burn's tanh-approximated GELU (within about 3e-6 of the exact one), so a second-order
    /// gradient through it is that approximation's.
    fn cpu_gelu_backward(x: FloatTensor<Self>, grad: FloatTensor<Self>) -> FloatTensor<Self> {
        <Self as ActivationOps<Self>>::gelu_backward(x, grad)
    }
}

/// Elementwise kernels over flex tensors.
mod flex {
    use burn::tensor::{Bytes, DType};
    use burn_flex::{FlexTensor, Layout};

    /// Runs `kernel` over the f32 contents of same-shaped `inputs` (made contiguous first) into a
    /// new contiguous tensor of that shape.
    pub fn map(inputs: &[FlexTensor], kernel: impl Fn(&[&[f32]], &mut [f32])) -> FlexTensor {
        let shape = inputs[0].layout().shape().clone();
        let n = shape.num_elements();
        let contiguous: Vec<FlexTensor> =
            inputs.iter().map(|t| if t.as_slice::<f32>().is_some() { t.clone() } else { t.to_contiguous() }).collect();
        let slices: Vec<&[f32]> =
            contiguous.iter().map(|t| t.as_slice::<f32>().expect("contiguous after to_contiguous")).collect();
        let mut out = vec![0f32; n];
        kernel(&slices, &mut out);
        FlexTensor::new(Bytes::from_elems(out), Layout::contiguous(shape), DType::F32)
    }
}

/// Elementwise kernels over ndarray tensors.
#[cfg(not(target_arch = "wasm32"))]
mod ndarray_f32 {
    use burn_ndarray::NdArrayTensor;
    use ndarray::{ArrayD, CowArray, IxDyn};

    /// Runs `kernel` over the contents of same-shaped f32 `inputs` (in standard layout) into a new
    /// tensor of that shape; `None` when an input is not f32.
    pub fn map(inputs: &[&NdArrayTensor], kernel: impl Fn(&[&[f32]], &mut [f32])) -> Option<NdArrayTensor> {
        let mut arrays = Vec::with_capacity(inputs.len());
        for input in inputs {
            let NdArrayTensor::F32(storage) = input else { return None };
            arrays.push(storage.view());
        }
        let views: Vec<CowArray<'_, f32, IxDyn>> = arrays.iter().map(|a| a.as_standard_layout()).collect();
        let shape = views[0].shape().to_vec();
        let slices: Vec<&[f32]> = views.iter().map(|v| v.as_slice().expect("standard layout")).collect();
        let mut out = vec![0f32; slices[0].len()];
        kernel(&slices, &mut out);
        let array = ArrayD::from_shape_vec(IxDyn(&shape), out).expect("length matches the shape");
        Some(NdArrayTensor::from(array.into_shared()))
    }
}

/// Elements per parallel task: large enough that a task outweighs rayon's scheduling (a few
/// microseconds), small enough that both cores get work on a 28 px quickstart activation.
const CHUNK: usize = 16 * 1024;

/// `out[i] = gelu(x[i])`, vectorized for the CPU this runs on, split across rayon's threads.
///
/// # Panics
/// If the slices differ in length.
pub fn gelu_f32(x: &[f32], out: &mut [f32]) {
    assert_eq!(x.len(), out.len(), "gelu_f32: input and output lengths differ");
    out.par_chunks_mut(CHUNK).zip(x.par_chunks(CHUNK)).for_each(|(out, x)| gelu_f32_serial(x, out));
}

/// `out[i] = grad[i] * gelu'(x[i])`, vectorized, split across rayon's threads.
///
/// # Panics
/// If the slices differ in length.
pub fn gelu_backward_f32(x: &[f32], grad: &[f32], out: &mut [f32]) {
    assert!(x.len() == grad.len() && x.len() == out.len(), "gelu_backward_f32: lengths differ");
    out.par_chunks_mut(CHUNK)
        .zip(x.par_chunks(CHUNK))
        .zip(grad.par_chunks(CHUNK))
        .for_each(|((out, x), grad)| gelu_backward_f32_serial(x, grad, out));
}

/// The widest vector unit this CPU has that the kernels are compiled for.
#[derive(Clone, Copy)]
pub(crate) enum VectorUnit {
    #[cfg(target_arch = "x86_64")]
    Avx512,
    #[cfg(target_arch = "x86_64")]
    Avx2Fma,
    Portable,
}

/// Detected once per call (std caches the CPUID answer), for both kernels.
pub(crate) fn vector_unit() -> VectorUnit {
    #[cfg(target_arch = "x86_64")]
    {
        if std::arch::is_x86_feature_detected!("avx512f") {
            return VectorUnit::Avx512;
        }
        if std::arch::is_x86_feature_detected!("avx2") && std::arch::is_x86_feature_detected!("fma") {
            return VectorUnit::Avx2Fma;
        }
    }
    VectorUnit::Portable
}

/// A kernel loop to compile once per vector unit: [`run_on`] runs `run::<FMA>` compiled for the
/// unit given, so that each kernel needs no wrapper of its own per unit. Every impl's `run` is
/// `#[inline(always)]`, so that it is compiled into [`run_on`]'s wrapper for the unit.
pub(crate) trait VectorKernel {
    /// The kernel, with fused multiply-adds where `FMA` ([`madd`]).
    fn run<const FMA: bool>(self);
}

/// `kernel.run()` compiled for `unit` (from [`vector_unit`]): with AVX-512 or AVX2 + FMA enabled
/// where the CPU has them, else the portable form.
pub(crate) fn run_on<K: VectorKernel>(unit: VectorUnit, kernel: K) {
    match unit {
        // SAFETY: vector_unit() answers Avx512 only when the CPU has AVX-512F.
        #[cfg(target_arch = "x86_64")]
        VectorUnit::Avx512 => unsafe { x86::run_avx512(kernel) },
        // SAFETY: vector_unit() answers Avx2Fma only when the CPU has AVX2 and FMA.
        #[cfg(target_arch = "x86_64")]
        VectorUnit::Avx2Fma => unsafe { x86::run_avx2(kernel) },
        _ => kernel.run::<PORTABLE_FMA>(),
    }
}

/// [`run_on`]'s wrappers for wider vector units.
#[cfg(target_arch = "x86_64")]
mod x86 {
    use super::VectorKernel;

    #[target_feature(enable = "avx512f")]
    pub fn run_avx512<K: VectorKernel>(kernel: K) {
        kernel.run::<true>();
    }
    #[target_feature(enable = "avx2,fma")]
    pub fn run_avx2<K: VectorKernel>(kernel: K) {
        kernel.run::<true>();
    }
}

/// [`gelu_f32`] on the calling thread.
fn gelu_f32_serial(x: &[f32], out: &mut [f32]) {
    run_on(vector_unit(), GeluPass::Forward { x, out });
}

/// [`gelu_backward_f32`] on the calling thread.
fn gelu_backward_f32_serial(x: &[f32], grad: &[f32], out: &mut [f32]) {
    run_on(vector_unit(), GeluPass::Backward { x, grad, out });
}

/// Whether the portable kernels (no run-time detected vector unit) may use fused multiply-adds:
/// on aarch64 every CPU has them; elsewhere `mul_add` without hardware FMA is a slow library
/// call.
pub(crate) const PORTABLE_FMA: bool = cfg!(target_arch = "aarch64");

/// `a b + c`: one fused multiply-add when `FMA` (the caller is compiled for a CPU that has one),
/// else a multiply and an add. A fused one rounds once, so results differ in the last bit.
#[inline(always)]
pub(crate) fn madd<const FMA: bool>(a: f32, b: f32, c: f32) -> f32 {
    if FMA { a.mul_add(b, c) } else { a * b + c }
}

#[inline(always)]
fn gelu_portable<const FMA: bool>(x: &[f32], out: &mut [f32]) {
    for (o, &v) in out.iter_mut().zip(x) {
        let (cdf, _) = cdf_and_density::<FMA>(v);
        *o = v * cdf;
    }
}

#[inline(always)]
fn gelu_backward_portable<const FMA: bool>(x: &[f32], grad: &[f32], out: &mut [f32]) {
    for ((o, &v), &g) in out.iter_mut().zip(x).zip(grad) {
        let (cdf, density) = cdf_and_density::<FMA>(v);
        *o = g * madd::<FMA>(v, density, cdf);
    }
}

/// One elementwise pass, for [`run_on`].
enum GeluPass<'a> {
    /// `out = gelu(x)` ([`gelu_portable`]).
    Forward { x: &'a [f32], out: &'a mut [f32] },
    /// `out = grad gelu'(x)` ([`gelu_backward_portable`]).
    Backward { x: &'a [f32], grad: &'a [f32], out: &'a mut [f32] },
}

impl VectorKernel for GeluPass<'_> {
    #[inline(always)]
    fn run<const FMA: bool>(self) {
        match self {
            GeluPass::Forward { x, out } => gelu_portable::<FMA>(x, out),
            GeluPass::Backward { x, grad, out } => gelu_backward_portable::<FMA>(x, grad, out),
        }
    }
}

/// `(Φ(x), φ(x))`: the standard normal CDF and density at `x`, branch-free (see module docs).
#[inline(always)]
#[allow(clippy::excessive_precision)] // the coefficients as published, not rounded by hand
pub(crate) fn cdf_and_density<const FMA: bool>(x: f32) -> (f32, f32) {
    // Abramowitz & Stegun, Handbook of Mathematical Functions (1964), formula 7.1.26.
    const P: f32 = 0.327_591_1;
    const A1: f32 = 0.254_829_592;
    const A2: f32 = -0.284_496_736;
    const A3: f32 = 1.421_413_741;
    const A4: f32 = -1.453_152_027;
    const A5: f32 = 1.061_405_429;
    const INV_SQRT_2PI: f32 = 0.398_942_28;
    let z = x.abs() * std::f32::consts::FRAC_1_SQRT_2;
    let t = 1.0 / madd::<FMA>(P, z, 1.0);
    let e = exp_nonpositive::<FMA>(-z * z);
    let poly = madd::<FMA>(t, A5, A4);
    let poly = madd::<FMA>(t, poly, A3);
    let poly = madd::<FMA>(t, poly, A2);
    let poly = madd::<FMA>(t, poly, A1);
    let half_erfc = 0.5 * t * poly * e;
    let cdf = if x >= 0.0 { 1.0 - half_erfc } else { half_erfc };
    (cdf, e * INV_SQRT_2PI)
}

/// `exp(v)` for `v <= 0`, branch-free; inputs below -87 (where `exp` is under 1.7e-38) give 0.
///
/// Cephes `expf`: `v = k ln 2 + r` with `|r| <= ln 2 / 2`, `exp(r)` by a degree-7 polynomial
/// (relative error about 1e-7), `2^k` written into the exponent bits.
#[inline(always)]
#[allow(clippy::excessive_precision)] // the coefficients as published, not rounded by hand
fn exp_nonpositive<const FMA: bool>(v: f32) -> f32 {
    const LN2_HI: f32 = 0.693_359_4;
    const LN2_LO: f32 = -2.121_944_4e-4;
    // Adding and subtracting 1.5 * 2^23 rounds to the nearest integer in f32 arithmetic.
    const ROUND: f32 = 12_582_912.0;
    let clamped = v < -87.0;
    let v = v.max(-87.0);
    let rounded = madd::<FMA>(v, std::f32::consts::LOG2_E, ROUND);
    let k = rounded - ROUND;
    let r = madd::<FMA>(-k, LN2_LO, madd::<FMA>(-k, LN2_HI, v));
    let p = 1.987_569_1e-4;
    let p = madd::<FMA>(p, r, 1.398_199_9e-3);
    let p = madd::<FMA>(p, r, 8.333_452e-3);
    let p = madd::<FMA>(p, r, 4.166_579_6e-2);
    let p = madd::<FMA>(p, r, 1.666_666_5e-1);
    let p = madd::<FMA>(p, r, 5.000_000_1e-1);
    let exp_r = madd::<FMA>(p * r, r, r) + 1.0;
    // k is an integer in [-126, 0], so k + 127 is a valid biased exponent. `rounded` and ROUND
    // share their exponent, so k is also the difference of their bit patterns: integer
    // arithmetic that vectorizes, where `k as i32` (a saturating conversion) went scalar.
    let k_int = rounded.to_bits() as i32 - ROUND.to_bits() as i32;
    let two_k = f32::from_bits(((k_int + 127) as u32) << 23);
    // Clamped inputs give 0, not exp(-87): so x φ(x) -> 0 for huge |x|, as in the exact form.
    if clamped { 0.0 } else { exp_r * two_k }
}

#[cfg(test)]
mod tests {
    use super::*;
    use burn::tensor::{Device, TensorData};

    fn grid() -> Vec<f32> {
        (0..=200_000).map(|i| -10.0 + i as f32 * 1e-4).collect()
    }

    #[test]
    fn exp_matches_std_on_its_range() {
        for i in 0..87_000 {
            let v = -(i as f32) * 1e-3;
            for (got, want) in [(exp_nonpositive::<false>(v), v.exp()), (exp_nonpositive::<true>(v), v.exp())] {
                assert!((got - want).abs() <= 2.5e-7 * want, "exp({v}) = {got}, want {want}");
            }
        }
    }

    #[test]
    fn gelu_matches_exact_form() {
        let x = grid();
        let (mut fast, mut fast_grad) = (vec![0.0; x.len()], vec![0.0; x.len()]);
        gelu_f32(&x, &mut fast);
        gelu_backward_f32(&x, &vec![1.0; x.len()], &mut fast_grad);
        // The dispatched kernel is the portable loop compiled for the detected unit: bit for bit
        // the same, with fused multiply-adds where that unit has them.
        let mut portable = vec![0.0; x.len()];
        if matches!(vector_unit(), VectorUnit::Portable) {
            gelu_portable::<PORTABLE_FMA>(&x, &mut portable);
        } else {
            gelu_portable::<true>(&x, &mut portable);
        }
        let device = Device::flex();
        let t =
            Tensor::<1>::from_data(TensorData::new(x.clone(), [x.len()]), &device.clone().autodiff()).require_grad();
        let exact_t = burn::tensor::activation::gelu(t.clone());
        let exact_grad = exact_t.clone().sum().backward();
        let exact: Vec<f32> = exact_t.into_data().to_vec().expect("f32");
        let exact_grad: Vec<f32> = t.grad(&exact_grad).expect("grad").into_data().to_vec().expect("f32");
        let mut worst = (0.0f32, 0.0f32);
        for i in 0..x.len() {
            worst.0 = worst.0.max((fast[i] - exact[i]).abs());
            worst.1 = worst.1.max((fast_grad[i] - exact_grad[i]).abs());
            assert_eq!(fast[i].to_bits(), portable[i].to_bits(), "dispatch changed gelu({})", x[i]);
        }
        eprintln!("largest |fast - exact| over [-10, 10]: gelu {:.2e}, gelu' {:.2e}", worst.0, worst.1);
        assert!(worst.0 <= MAX_ABS_ERROR && worst.1 <= MAX_ABS_ERROR, "largest differences {worst:?}");
    }

    #[test]
    fn special_values() {
        let x = [0.0, -0.0, f32::NAN, f32::INFINITY, 1e30, -1e30, 80.0, -80.0];
        let mut out = [0.0; 8];
        gelu_f32(&x, &mut out);
        assert_eq!(&out[..2], &[0.0, 0.0]);
        assert!(out[2].is_nan());
        assert_eq!(out[3], f32::INFINITY);
        assert_eq!(out[4], 1e30);
        assert_eq!(out[6], 80.0);
        // The exact values are about -1e-1392 and -1e-1393: zero in f32.
        assert_eq!((out[5], out[7]), (0.0, 0.0));
        // The derivative tends to 1 and 0, with no floor left by the clamped exp.
        let mut grad = [0.0; 8];
        gelu_backward_f32(&x, &[1.0; 8], &mut grad);
        assert!(grad[2].is_nan());
        assert_eq!((grad[4], grad[5], grad[6], grad[7]), (1.0, 0.0, 1.0, 0.0));
    }

    /// burn's exact GELU on flex: values and input gradients of `sum(gelu(x^T) * w)`.
    fn reference(x: &TensorData, w: &TensorData) -> (TensorData, TensorData) {
        let device = Device::flex().autodiff();
        let x = Tensor::<2>::from_data(x.clone(), &device).require_grad();
        let y = burn::tensor::activation::gelu(x.clone().transpose())
            * Tensor::from_data(w.clone(), &device).require_grad();
        let grads = y.clone().sum().backward();
        (y.into_data(), x.grad(&grads).expect("grad").into_data())
    }

    /// The extension through the tensor API matches burn's exact GELU on flex, values and input
    /// gradients, on both CPU backends, with and without gradient checkpointing, on a strided
    /// (transposed) input. (burn-ndarray's own `gelu_backward` is the derivative of the tanh
    /// approximation, up to 3e-6 off here; vramfit's op gives ndarray the exact gradient.)
    #[test]
    fn tensor_op_matches_exact_gelu_on_both_backends() {
        let x = TensorData::new((0..96).map(|i| (i as f32 - 48.0) * 0.11).collect::<Vec<_>>(), [8, 12]);
        let w = TensorData::new((0..96).map(|i| i as f32 * 0.01).collect::<Vec<_>>(), [12, 8]);
        let (want_y, want_grad) = reference(&x, &w);
        let close = |a: TensorData, b: &TensorData| {
            a.assert_approx_eq::<f32>(b, burn::tensor::Tolerance::absolute(MAX_ABS_ERROR))
        };
        for (_, _, device) in crate::kernels::cpu_tensor::test_data::cpu_training_devices() {
            let xt = Tensor::<2>::from_data(x.clone(), &device).require_grad();
            // `w` is tracked, so the product keeps (or, checkpointing, recomputes) the GELU's
            // output: the checkpointed run exercises `RetroGelu`.
            let y = gelu(xt.clone().transpose()) * Tensor::from_data(w.clone(), &device).require_grad();
            let grads = y.clone().sum().backward();
            close(y.into_data(), &want_y);
            close(xt.grad(&grads).expect("grad").into_data(), &want_grad);
        }
    }
}
