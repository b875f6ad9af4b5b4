//! Augmentation on the device: crop, horizontal flip, colour jitter, normalization and random
//! erasing of a batch of 8-bit RGB images, in vramfit's own WGSL kernel
//! (`shaders/augment_rgb8.wgsl`), launched through a burn backend extension on the wgpu device.
//!
//! The random draws stay on the CPU: [`AugmentParams::draw`] draws each image's crop origin,
//! flip, jitter factors and erasing rectangle from the sample's generator in the order the CPU
//! path ([`crate::data::pipeline::SamplePipeline::tensor_from_resized`]) draws them, so a seed gives the
//! same augmentation on either path. The kernel then does the per-pixel work; a test compares it
//! with the CPU path image by image (`device_augmentation_matches_the_cpu_path`).
//!
//! # Inputs and outputs
//! - `pixels`: `[N, src_h, src_w]` u32, each pixel `r | g << 8 | b << 16` (the images of a batch
//!   share one size; training passes the loader's crops, which are the output size).
//! - `params`: [`PARAMS_HEADER`] words, then [`PARAMS_PER_IMAGE`] words per image (layout in the
//!   WGSL file's header; f32 values are stored as their bits).
//! - output: `[N, 3, out_h, out_w]` f32, normalized `(v - mean) / std`, on the inner
//!   (non-autodiff) device; the op has no gradient.
//!
//! Only a wgpu device compiling WGSL runs the kernel ([`runs_wgsl`]); other devices keep the CPU
//! path. Training uses it when `augment.on_device` is set ([`augments_on_device`]): the loader
//! packs each batch ([`crate::data::batch::PackedImages`]) and the training step launches the kernel.

use burn::backend::tensor::{FloatTensor, IntTensor};
use burn::backend::wgpu::CubeBackend;
use burn::backend::{Backend, Dispatch, DispatchDevice, backend_extension};
use burn::cubecl::CubeCount;
use burn::tensor::{DType, Device, Int, Shape, Tensor, TensorData};
use rand::Rng;

use crate::config::AugmentConfig;
use crate::data::augment::{self, EraseRect};
use crate::data::preprocess::PreprocessConfig;
use crate::engine::error::{Error, Result};
use crate::kernels::wgsl_kernel;

/// Words of the parameter header (see the WGSL file).
pub const PARAMS_HEADER: usize = 16;
/// Words per image after the header.
pub const PARAMS_PER_IMAGE: usize = 8;
/// Threads per workgroup; one workgroup per image (`@workgroup_size` in the WGSL).
const WORKGROUP: u32 = 256;
/// The kernel's source.
const WGSL: &str = include_str!("../../shaders/augment_rgb8.wgsl");

/// What the kernel does to one image, drawn on the CPU.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct ImageAugment {
    /// Top-left corner `(x, y)` of the crop in the source image.
    pub crop_origin: (u32, u32),
    /// Horizontal flip of the crop.
    pub flip: bool,
    /// `[brightness, contrast, saturation]` factors (1 = unchanged).
    pub jitter: [f32; 3],
    /// The rectangle set to 0 after normalization.
    pub erase: Option<EraseRect>,
}

/// The kernel's parameter buffer for one batch.
#[derive(Clone, Debug, PartialEq)]
pub struct AugmentParams {
    words: Vec<u32>,
}

impl AugmentParams {
    /// Parameters for `images` cropped from `src` `(height, width)` sources to `out`
    /// `(height, width)`, normalized with `mean` and `std`.
    ///
    /// # Errors
    /// [`Error::Preprocess`] when a crop or erasing rectangle leaves its image, or the batch is
    /// empty or over 65535 images (one workgroup each): the kernel does no bounds checks.
    pub fn new(
        images: &[ImageAugment],
        src: (usize, usize),
        out: (usize, usize),
        mean: [f32; 3],
        std: [f32; 3],
    ) -> Result<Self> {
        let bad = |why: String| Error::Preprocess(format!("device augmentation: {why}"));
        if images.is_empty() || images.len() > 65_535 {
            return Err(bad(format!("{} images in a batch (1-65535)", images.len())));
        }
        if out.0 == 0 || out.1 == 0 || out.0 > src.0 || out.1 > src.1 || src.1 > 0xffff || src.0 > 0xffff {
            return Err(bad(format!("output {out:?} from sources {src:?}")));
        }
        // The kernel indexes in u32.
        let elements = |hw: (usize, usize)| images.len() as u64 * 3 * hw.0 as u64 * hw.1 as u64;
        if elements(src).max(elements(out)) > u64::from(u32::MAX) {
            return Err(bad(format!("{} images of {src:?} are over the kernel's 32-bit indices", images.len())));
        }
        let mut words = vec![0u32; PARAMS_HEADER + PARAMS_PER_IMAGE * images.len()];
        words[..6].copy_from_slice(&[
            images.len() as u32,
            src.0 as u32,
            src.1 as u32,
            out.0 as u32,
            out.1 as u32,
            PARAMS_PER_IMAGE as u32,
        ]);
        for c in 0..3 {
            words[6 + c] = mean[c].to_bits();
            words[9 + c] = (1.0 / std[c]).to_bits();
        }
        for (i, a) in images.iter().enumerate() {
            let (x, y) = (a.crop_origin.0 as usize, a.crop_origin.1 as usize);
            if x + out.1 > src.1 || y + out.0 > src.0 {
                return Err(bad(format!("crop at ({x}, {y}) leaves the {src:?} image")));
            }
            let (ex, ey, ew, eh) = a.erase.map_or((0, 0, 0, 0), |r| (r.x0, r.y0, r.width, r.height));
            if ex + ew > out.1 || ey + eh > out.0 {
                return Err(bad(format!("erasing {:?} leaves the {out:?} output", a.erase)));
            }
            let w = &mut words[PARAMS_HEADER + i * PARAMS_PER_IMAGE..][..PARAMS_PER_IMAGE];
            w[0] = x as u32;
            w[1] = y as u32;
            w[2] = u32::from(a.flip);
            for k in 0..3 {
                w[3 + k] = a.jitter[k].to_bits();
            }
            w[6] = ex as u32 | (ey as u32) << 16;
            w[7] = ew as u32 | (eh as u32) << 16;
        }
        Ok(Self { words })
    }

    /// Draws one image's augmentation (`aug`, `None` for none) under `preprocess` from `rng`,
    /// in the order and with the draws of the CPU path (crop origin, flip, jitter, erasing), for
    /// a resized source of `resized` `(width, height)`.
    ///
    /// # Errors
    /// As [`crate::data::preprocess::PreprocessConfig::crop_origin`].
    pub fn draw(
        preprocess: &PreprocessConfig,
        aug: Option<&AugmentConfig>,
        resized: (u32, u32),
        rng: &mut impl Rng,
    ) -> Result<ImageAugment> {
        let random_crop = aug.is_some_and(|a| a.random_crop);
        let crop_origin = preprocess.crop_origin(resized, random_crop, rng)?;
        let (out_w, out_h) = preprocess.output_size_for(resized)?;
        let Some(aug) = aug else {
            return Ok(ImageAugment { crop_origin, flip: false, jitter: [1.0; 3], erase: None });
        };
        let flip = augment::draw_flip(aug, rng);
        let jitter = augment::draw_jitter(aug.color_jitter, rng).unwrap_or([1.0; 3]);
        let erase = augment::draw_erasing(out_h as usize, out_w as usize, aug.random_erasing, rng);
        Ok(ImageAugment { crop_origin, flip, jitter, erase })
    }

    fn images(&self) -> usize {
        self.words[0] as usize
    }

    fn out_hw(&self) -> (usize, usize) {
        (self.words[3] as usize, self.words[4] as usize)
    }

    fn src_hw(&self) -> (usize, usize) {
        (self.words[1] as usize, self.words[2] as usize)
    }
}

/// Packs 8-bit RGB pixels (`[r, g, b]` triples) as the kernel reads them: one u32 each,
/// `r | g << 8 | b << 16`.
pub fn pack_rgb8(rgb: &[u8]) -> Vec<u32> {
    rgb.chunks_exact(3).map(|p| u32::from_le_bytes([p[0], p[1], p[2], 0])).collect()
}

/// Whether `device` runs the WGSL kernel: a wgpu device whose compiler is WGSL.
pub fn runs_wgsl(device: &Device) -> bool {
    match device.clone().inner().as_dispatch() {
        // The runtime's name says its compiler: wgpu<wgsl>, wgpu<spirv> or wgpu<msl>.
        DispatchDevice::Cube(cube) => cube.client().name() == "wgpu<wgsl>",
        _ => false,
    }
}

/// Whether a run of `config` on `device` augments on the device: `augment.on_device` is set and
/// the device runs the kernel ([`runs_wgsl`]).
pub fn augments_on_device(config: &crate::config::Config, device: &Device) -> bool {
    config.augment.on_device && runs_wgsl(device)
}

thread_local! {
    /// Batches [`augment_batch`] launched the kernel for on this thread.
    static LAUNCHES: std::cell::Cell<usize> = const { std::cell::Cell::new(0) };
}

/// How many batches [`augment_batch`] has augmented on the device from this thread (a training
/// step calls it on the thread that runs the step): what shows a run really took the kernel.
pub fn launches_on_this_thread() -> usize {
    LAUNCHES.with(std::cell::Cell::get)
}

/// Augments and normalizes a batch on `device`: `pixels` are `[N, src_h, src_w]` packed as
/// [`pack_rgb8`] does. Returns `[N, 3, out_h, out_w]` f32 on the inner (non-autodiff) device.
///
/// # Errors
/// [`Error::Device`] when `device` does not run WGSL ([`runs_wgsl`]), or `pixels` does not hold
/// `N x src_h x src_w` pixels.
pub fn augment_batch(pixels: Vec<u32>, params: AugmentParams, device: &Device) -> Result<Tensor<4>> {
    if !runs_wgsl(device) {
        return Err(Error::Device("device augmentation needs a wgpu device that compiles WGSL".into()));
    }
    let (n, (src_h, src_w)) = (params.images(), params.src_hw());
    if pixels.len() != n * src_h * src_w {
        return Err(Error::Device(format!(
            "device augmentation: {} pixels for {n} images of {src_h} x {src_w}",
            pixels.len()
        )));
    }
    LAUNCHES.with(|l| l.set(l.get() + 1));
    let inner = device.clone().inner();
    let pixels = Tensor::<3, Int>::from_data(TensorData::new(pixels, [n, src_h, src_w]), (&inner, DType::U32));
    Ok(Tensor::from_dispatch(<Dispatch as DeviceAugment>::augment_rgb8(pixels.into_dispatch(), params)))
}

/// The backend extension: the kernel on the wgpu backend (through fusion, which runs it lazily).
#[backend_extension(Cube, Fusion)]
pub trait DeviceAugment: Backend {
    /// `pixels` `[N, src_h, src_w]` u32 -> `[N, 3, out_h, out_w]` f32 (see the module docs).
    #[fusion(
        dtype = burn::tensor::DType::F32,
        shape = burn::tensor::Shape::new([params.words[0] as usize, 3, params.words[3] as usize, params.words[4] as usize])
    )]
    fn augment_rgb8(pixels: IntTensor<Self>, params: AugmentParams) -> FloatTensor<Self>;
}

impl DeviceAugment for CubeBackend {
    fn augment_rgb8(pixels: IntTensor<Self>, params: AugmentParams) -> FloatTensor<Self> {
        let (n, (out_h, out_w)) = (params.images(), params.out_hw());
        let output = wgsl_kernel::empty_f32(&pixels, Shape::new([n, 3, out_h, out_w]));
        let grid = CubeCount::Static(n as u32, 1, 1);
        wgsl_kernel::launch(WGSL, WORKGROUP, grid, &[&pixels], &params.words, &[&output]);
        output
    }
}
