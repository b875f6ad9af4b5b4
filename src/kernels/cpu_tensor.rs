//! Contiguous f32 access to the CPU backends' tensors, for vramfit's own CPU kernels
//! ([`crate::kernels::group_norm_gelu`], [`crate::kernels::depthwise_conv`]). The kernels' callers check that the
//! tensors are f32; the accessors panic otherwise.
// burn-ndarray is deprecated upstream, but it is the CPU fallback users asked for.
#![allow(deprecated)]

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
    use burn::tensor::TensorData;
    use rand::{Rng, SeedableRng};

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
