//! Contiguous f32 access to the CPU backends' tensors, for vramfit's own CPU kernels
//! ([`crate::kernels::group_norm_gelu`], [`crate::kernels::depthwise_conv`]). The kernels' callers check that the
//! tensors are f32; the accessors panic otherwise.
//!
//! [`CpuTensors`] puts both backends behind one trait, so that each backend extension's CPU
//! form is written once, generic over the backend.
// burn-ndarray is deprecated upstream, but it is the CPU fallback users asked for.
#![allow(deprecated)]

#[cfg(not(target_arch = "wasm32"))]
use burn::backend::NdArray;
use burn::backend::tensor::FloatTensor;
use burn::backend::{Backend, ExtensionType, Flex};

/// One convolution layer's parameters as backend tensors, an operand of the fused CPU passes'
/// backend extensions ([`crate::kernels::depthwise_conv`]'s fused op, [`crate::model::fused_stem`],
/// [`crate::model::fused_block`]).
#[derive(ExtensionType)]
pub struct LayerTensors<B: Backend> {
    /// The convolution's weight: `[C_out, C_in / groups, 3, 3]` or `[C_out, C_in, 1, 1]`.
    pub weight: FloatTensor<B>,
    /// The GroupNorm's scale `γ`, `[C_out]`.
    pub gamma: FloatTensor<B>,
    /// The GroupNorm's shift `β`, `[C_out]`.
    pub beta: FloatTensor<B>,
}

/// A 3x3 convolution's stride with its GroupNorm's settings: the fused convolution + GroupNorm +
/// GELU passes' settings besides their tensors.
#[derive(Clone, Copy, Debug)]
pub struct ConvNormSettings {
    /// The convolution's stride both ways.
    pub stride: usize,
    /// GroupNorm groups (dividing `C_out`).
    pub num_groups: usize,
    /// GroupNorm's epsilon.
    pub epsilon: f64,
}

/// The CPU backends (flex, and ndarray in native builds) as vramfit's CPU kernels use their
/// float tensors: contiguous f32 values with their dims in, new f32 tensors out.
///
/// # Panics
/// The accessors panic on a tensor that is not f32 (the kernels' callers check the dtype).
pub trait CpuTensors: Backend {
    /// A tensor made contiguous: the tensor itself (or a borrow of it) where it already is, a
    /// row-major copy otherwise.
    type Contiguous<'a>;

    /// `t` made contiguous (copied only where it is not).
    fn contiguous(t: &FloatTensor<Self>) -> Self::Contiguous<'_>;

    /// The f32 values of a tensor from [`CpuTensors::contiguous`], row-major.
    fn values<'a>(t: &'a Self::Contiguous<'_>) -> &'a [f32];

    /// The dims of a tensor from [`CpuTensors::contiguous`].
    fn dims<'a>(t: &'a Self::Contiguous<'_>) -> &'a [usize];

    /// The values of a tensor from [`CpuTensors::contiguous`] as a vector to write (a copy,
    /// unless the contiguous form already owns them).
    fn into_values(t: Self::Contiguous<'_>) -> Vec<f32>;

    /// The f32 values of `t` to overwrite in place, where no other tensor sees the write;
    /// `None` otherwise (and then nothing is copied).
    fn unique_f32s_mut(t: &mut FloatTensor<Self>) -> Option<&mut [f32]>;

    /// A new contiguous f32 tensor of `dims` holding `values` (`dims`' product of them).
    fn tensor(values: Vec<f32>, dims: &[usize]) -> FloatTensor<Self>;
}

impl CpuTensors for Flex {
    type Contiguous<'a> = burn_flex::FlexTensor;

    fn contiguous(t: &FloatTensor<Self>) -> Self::Contiguous<'_> {
        flex::contiguous(t)
    }

    fn values<'a>(t: &'a Self::Contiguous<'_>) -> &'a [f32] {
        flex::f32s(t)
    }

    fn dims<'a>(t: &'a Self::Contiguous<'_>) -> &'a [usize] {
        flex::dims(t)
    }

    fn into_values(t: Self::Contiguous<'_>) -> Vec<f32> {
        flex::f32s(&t).to_vec()
    }

    fn unique_f32s_mut(t: &mut FloatTensor<Self>) -> Option<&mut [f32]> {
        flex::unique_f32s_mut(t)
    }

    fn tensor(values: Vec<f32>, dims: &[usize]) -> FloatTensor<Self> {
        flex::tensor_of_shape(values, dims.to_vec())
    }
}

/// ndarray: the contiguous form is [`nd::contiguous`]'s `(values, dims)`; no tensor is
/// overwritten in place.
#[cfg(not(target_arch = "wasm32"))]
impl CpuTensors for NdArray {
    type Contiguous<'a> = (std::borrow::Cow<'a, [f32]>, Vec<usize>);

    fn contiguous(t: &FloatTensor<Self>) -> Self::Contiguous<'_> {
        nd::contiguous(t)
    }

    fn values<'a>(t: &'a Self::Contiguous<'_>) -> &'a [f32] {
        &t.0
    }

    fn dims<'a>(t: &'a Self::Contiguous<'_>) -> &'a [usize] {
        &t.1
    }

    fn into_values(t: Self::Contiguous<'_>) -> Vec<f32> {
        t.0.into_owned()
    }

    fn unique_f32s_mut(_: &mut FloatTensor<Self>) -> Option<&mut [f32]> {
        None
    }

    fn tensor(values: Vec<f32>, dims: &[usize]) -> FloatTensor<Self> {
        nd::tensor(values, dims)
    }
}

/// burn flex tensors.
pub mod flex {
    use burn::tensor::{Bytes, DType, Shape};
    use burn_flex::{FlexTensor, Layout};

    /// `t` itself when contiguous, else a contiguous copy.
    pub fn contiguous(t: &FlexTensor) -> FlexTensor {
        if t.as_slice::<f32>().is_some() { t.clone() } else { t.to_contiguous() }
    }

    /// The f32 contents of a tensor from [`contiguous`].
    ///
    /// # Panics
    /// If the tensor is not f32.
    pub fn f32s(t: &FlexTensor) -> &[f32] {
        t.as_slice::<f32>().expect("vramfit's CPU kernels take f32 tensors (their callers check the dtype)")
    }

    /// The f32 values of `t` to overwrite in place: `Some` when `t` is f32, contiguous and the
    /// only holder of its storage (no other tensor sees the write, e.g. a convolution's output
    /// at inference); `None` otherwise, and then nothing is copied.
    pub fn unique_f32s_mut(t: &mut FlexTensor) -> Option<&mut [f32]> {
        if t.dtype() != DType::F32 {
            return None;
        }
        let (start, end) = t.layout().contiguous_offsets()?;
        t.try_storage_mut::<f32>()?.get_mut(start..end)
    }

    /// The tensor's dims.
    pub fn dims(t: &FlexTensor) -> &[usize] {
        t.layout().shape()
    }

    /// A new contiguous f32 tensor with `like`'s shape.
    pub fn tensor(values: Vec<f32>, like: &FlexTensor) -> FlexTensor {
        FlexTensor::new(Bytes::from_elems(values), Layout::contiguous(like.layout().shape().clone()), DType::F32)
    }

    /// A new contiguous f32 tensor of `dims`.
    pub fn tensor_of_shape(values: Vec<f32>, dims: Vec<usize>) -> FlexTensor {
        FlexTensor::new(Bytes::from_elems(values), Layout::contiguous(Shape::from(dims)), DType::F32)
    }
}

/// burn ndarray tensors (native builds: the web build has no ndarray backend).
#[cfg(not(target_arch = "wasm32"))]
pub mod nd {
    use std::borrow::Cow;

    use burn_ndarray::NdArrayTensor;
    use ndarray::{ArrayD, IxDyn};

    /// The f32 contents in standard (row-major) layout (borrowed when the tensor already is, as
    /// every tensor the network's ops produce is; copied otherwise), and the dims.
    ///
    /// # Panics
    /// If the tensor is not f32.
    pub fn contiguous(t: &NdArrayTensor) -> (Cow<'_, [f32]>, Vec<usize>) {
        let NdArrayTensor::F32(storage) = t else {
            panic!("vramfit's CPU kernels take f32 tensors (their callers check the dtype)")
        };
        let view = storage.view();
        let dims = view.shape().to_vec();
        match view.to_slice() {
            Some(values) => (Cow::Borrowed(values), dims),
            None => (Cow::Owned(view.as_standard_layout().into_owned().into_raw_vec_and_offset().0), dims),
        }
    }

    /// A new f32 tensor of `dims`.
    pub fn tensor(values: Vec<f32>, dims: &[usize]) -> NdArrayTensor {
        let array = ArrayD::from_shape_vec(IxDyn(dims), values).expect("length matches the dims");
        NdArrayTensor::from(array.into_shared())
    }
}

/// Seeded test inputs for the CPU kernels' tests.
#[cfg(test)]
pub mod test_data {
    use burn::tensor::{Device, TensorData};
    use rand::{Rng, SeedableRng};

    /// The training devices the CPU kernels' tests compare against a reference: autodiff over
    /// flex and over ndarray, each without and with gradient checkpointing, as
    /// `(base, checkpointing, device)`.
    pub fn cpu_training_devices() -> Vec<(Device, bool, Device)> {
        let with = |base: Device, checkpointing: bool| {
            let device = base.clone().autodiff();
            (base, checkpointing, if checkpointing { device.gradient_checkpointing() } else { device })
        };
        [Device::flex(), Device::ndarray()].into_iter().flat_map(|b| [with(b.clone(), false), with(b, true)]).collect()
    }

    /// `dims`-shaped values of mean `mean` and standard deviation about `std` (the sum of four
    /// uniforms, Irwin-Hall), the same for the same `seed` on every run.
    pub fn normal(dims: &[usize], mean: f32, std: f32, seed: u64) -> TensorData {
        let mut rng = rand::rngs::SmallRng::seed_from_u64(seed);
        let n = dims.iter().product::<usize>();
        // Four uniforms on [0, 1) sum to mean 2, variance 1/3.
        let values: Vec<f32> = (0..n)
            .map(|_| mean + std * ((0..4).map(|_| rng.random::<f32>()).sum::<f32>() - 2.0) * 3f32.sqrt())
            .collect();
        TensorData::new(values, dims.to_vec())
    }
}
