//! vramfit's augmentation kernel (`shaders/augment_rgb8.wgsl`, `src/kernels/device_augment.rs`) against
//! the CPU path it replaces on a GPU: the same seeds give the same crops, flips, jitter and
//! erasing, and the same pixels within 1/255 before normalization.

use super::*;
use rand::{Rng, SeedableRng};
use vramfit::config::AugmentConfig;
use vramfit::data::augment::EraseRect;
use vramfit::data::pipeline::StageTimes;
use vramfit::kernels::device_augment::{self, AugmentParams, ImageAugment};

/// `n` random 40 x 40 images (what the cache holds at `load_size` 40).
fn random_images(n: usize) -> Vec<image::RgbImage> {
    let mut rng = rand::rngs::SmallRng::seed_from_u64(7);
    (0..n).map(|_| image::RgbImage::from_fn(40, 40, |_, _| image::Rgb(rng.random::<[u8; 3]>()))).collect()
}

/// The CPU path's `[3, 32, 32]` output per image and the device path's, each image's generator
/// seeded with its index on both paths.
fn both_paths(
    pipeline: &SamplePipeline,
    images: &[image::RgbImage],
    device: &SelectedDevice,
) -> (Vec<Vec<f32>>, Vec<f32>, Vec<ImageAugment>) {
    let seeded = |i: usize| rand::rngs::SmallRng::seed_from_u64(1000 + i as u64);
    let cpu: Vec<Vec<f32>> = images
        .iter()
        .enumerate()
        .map(|(i, img)| pipeline.tensor_from_resized(img, &mut seeded(i), &mut StageTimes::default()).unwrap().0)
        .collect();
    let drawn: Vec<ImageAugment> = images
        .iter()
        .enumerate()
        .map(|(i, img)| {
            AugmentParams::draw(&pipeline.preprocess, pipeline.augment.as_ref(), img.dimensions(), &mut seeded(i))
                .unwrap()
        })
        .collect();
    let params = AugmentParams::new(&drawn, (40, 40), (32, 32), pipeline.mean, pipeline.std).unwrap();
    let pixels: Vec<u32> = images.iter().flat_map(|img| device_augment::pack_rgb8(img.as_raw())).collect();
    let out = device_augment::augment_batch(pixels, params, &device.device).unwrap();
    assert_eq!(out.dims(), [images.len(), 3, 32, 32]);
    (cpu, out.into_data().try_into_vec::<f32>().unwrap(), drawn)
}

/// Largest difference between the paths in 0..1 units (before normalization).
fn largest_difference(pipeline: &SamplePipeline, cpu: &[Vec<f32>], device: &[f32]) -> f32 {
    let plane = 32 * 32;
    let mut worst = 0f32;
    for (i, image) in cpu.iter().enumerate() {
        for (j, &v) in image.iter().enumerate() {
            let d = (v - device[i * 3 * plane + j]).abs() * pipeline.std[j / plane];
            assert!(
                d <= 1.0 / 255.0,
                "image {i}, element {j}: {v} vs {} (NaN fails here too)",
                device[i * 3 * plane + j]
            );
            worst = worst.max(d);
        }
    }
    worst
}

#[test]
fn device_augmentation_matches_the_cpu_path() {
    let Some(device) = gpu_or_skip() else { return };
    let mut config = quickstart();
    config.data.preprocess = PreprocessConfig { mode: PreprocessMode::ResizeAndCrop, load_size: 40, crop_size: 32 };
    config.data.mean = [0.485, 0.456, 0.406];
    config.data.std = [0.229, 0.224, 0.225];
    config.augment =
        AugmentConfig { random_crop: true, hflip: true, color_jitter: 0.4, random_erasing: 0.5, on_device: true };
    let images = random_images(16);

    let training = SamplePipeline::from_config(&config, true);
    let (cpu, gpu_out, drawn) = both_paths(&training, &images, &device);
    // The draws exercise every stage: crops off the corner, flips, jitter, erasing.
    assert!(drawn.iter().any(|a| a.flip) && drawn.iter().any(|a| !a.flip), "{drawn:?}");
    assert!(drawn.iter().filter(|a| a.erase.is_some()).count() >= 2, "{drawn:?}");
    assert!(drawn.iter().any(|a| a.crop_origin != (0, 0) && a.crop_origin != (4, 4)), "{drawn:?}");
    assert!(drawn.iter().all(|a| a.jitter != [1.0; 3]), "{drawn:?}");
    let worst = largest_difference(&training, &cpu, &gpu_out);
    assert!(worst <= 1.0 / 255.0, "largest difference {worst} over 1/255");
    // An erased rectangle reads 0 on both paths, and the image around it does not.
    let (i, r) = drawn.iter().enumerate().find_map(|(i, a)| a.erase.map(|r| (i, r))).unwrap();
    let EraseRect { y0, x0, .. } = r;
    assert_eq!(gpu_out[i * 3 * 1024 + y0 * 32 + x0], 0.0);

    // Evaluation: a centre crop and normalization only.
    let evaluation = SamplePipeline::from_config(&config, false);
    let (cpu, gpu_out, drawn) = both_paths(&evaluation, &images, &device);
    assert!(drawn.iter().all(|a| a.crop_origin == (4, 4) && !a.flip && a.erase.is_none()));
    assert!(largest_difference(&evaluation, &cpu, &gpu_out) <= 1.0 / 255.0);
    // The kernel's output is the image, not a constant: it follows the source pixels.
    let expected = (images[0].get_pixel(4, 4).0[0] as f32 / 255.0 - 0.485) / 0.229;
    assert!((gpu_out[0] - expected).abs() < 1e-3, "{} vs {expected}", gpu_out[0]);
}

#[test]
fn device_augmentation_refuses_a_crop_outside_the_image_and_a_cpu_device() {
    let a = ImageAugment { crop_origin: (9, 0), flip: false, jitter: [1.0; 3], erase: None };
    let err = AugmentParams::new(&[a], (40, 40), (32, 32), [0.0; 3], [1.0; 3]).unwrap_err();
    assert!(err.to_string().contains("crop at (9, 0)"), "{err}");
    let erase = Some(EraseRect { y0: 30, x0: 0, height: 4, width: 4 });
    let err =
        AugmentParams::new(&[ImageAugment { erase, crop_origin: (0, 0), ..a }], (40, 40), (32, 32), [0.0; 3], [1.0; 3])
            .unwrap_err();
    assert!(err.to_string().contains("erasing"), "{err}");
    assert!(AugmentParams::new(&[], (40, 40), (32, 32), [0.0; 3], [1.0; 3]).is_err());
    let cpu = device::select(DeviceChoice::Cpu(CpuBackend::Flex)).unwrap();
    assert!(!device_augment::runs_wgsl(&cpu.device));
    let params =
        AugmentParams::new(&[ImageAugment { crop_origin: (0, 0), ..a }], (40, 40), (32, 32), [0.0; 3], [1.0; 3])
            .unwrap();
    let err = device_augment::augment_batch(vec![0; 1600], params, &cpu.device).unwrap_err();
    assert!(err.to_string().contains("wgpu"), "{err}");
}

/// Training with `augment.on_device` (the loader packs 8-bit batches and the step runs the
/// kernel) gives the losses of training with the CPU's augmentation from the same seed: the same
/// draws, the same pixels within 1/255, the same initial weights. With and without activation
/// checkpointing (the kernel's output joins the training device's autodiff strategy).
#[test]
fn training_with_device_augmentation_follows_the_cpu_path() {
    let Some(device) = gpu_or_skip() else { return };
    let splits = bundled();
    let dir = tempfile::tempdir().unwrap();
    for checkpointing in [false, true] {
        let run = |on_device: bool| {
            let mut config = quickstart();
            config.augment =
                AugmentConfig { random_crop: true, hflip: true, color_jitter: 0.4, random_erasing: 0.5, on_device };
            config.train.checkpointing = checkpointing;
            let mut req = TrainRequest::new(config, dir.path().join(format!("{checkpointing}-{on_device}")));
            req.max_steps = Some(3);
            req.export = false;
            let (mut losses, mut augmented_on_device) = (Vec::new(), None);
            let launches = device_augment::launches_on_this_thread();
            train::train(
                &req,
                &device,
                &splits,
                &mut |e| match e {
                    Event::Started { augment_on_device, .. } => augmented_on_device = Some(augment_on_device),
                    Event::Step { loss, .. } => losses.push(loss),
                    _ => {}
                },
                &StopSignal::new(),
            )
            .unwrap();
            assert_eq!(augmented_on_device, Some(on_device));
            // The kernel really ran, once per step, or never.
            let batches = device_augment::launches_on_this_thread() - launches;
            assert_eq!(batches, if on_device { 3 } else { 0 }, "checkpointing {checkpointing}");
            losses
        };
        let (cpu, on_device) = (run(false), run(true));
        assert_eq!(cpu.len(), 3);
        for (a, b) in cpu.iter().zip(&on_device) {
            assert!(
                (a - b).abs() <= 2e-3 * a.abs().max(1.0),
                "checkpointing {checkpointing}: {cpu:?} vs {on_device:?}"
            );
        }
        // The steps trained: the losses are of augmented batches, not of a constant input.
        assert!(cpu.windows(2).any(|w| w[0] != w[1]), "{cpu:?}");
    }
}
