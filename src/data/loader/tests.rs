use super::Batch;

fn batch(n: usize) -> Batch {
    // Image i is filled with the value i, so each piece shows which images it holds.
    let (h, w) = (2, 3);
    let images = (0..n).flat_map(|i| std::iter::repeat_n(i as f32, 3 * h * w)).collect();
    Batch { images, labels: (0..n as i64).collect(), height: h, width: w, ..Default::default() }
}

#[test]
fn split_keeps_every_image_once_in_order() {
    let pieces = batch(7).split(3);
    assert_eq!(pieces.iter().map(Batch::len).collect::<Vec<_>>(), vec![3, 3, 1]);
    let labels: Vec<i64> = pieces.iter().flat_map(|b| b.labels.clone()).collect();
    assert_eq!(labels, (0..7).collect::<Vec<_>>());
    for p in &pieces {
        assert_eq!(p.images.len(), p.len() * 18);
        for (i, label) in p.labels.iter().enumerate() {
            assert!(p.images[i * 18..(i + 1) * 18].iter().all(|&v| v == *label as f32));
        }
    }
}

#[test]
fn a_cached_pass_gives_the_same_batches_as_decoding_and_the_second_pass_decodes_nothing() {
    use std::sync::Arc;
    let dir = tempfile::tempdir().unwrap();
    let paths = crate::bench::loader::write_photos(&dir.path().join("photos"), 640, 480, 5, 2).unwrap();
    let dataset = Arc::new(crate::bench::loader::dataset_of(paths));
    let mut config = crate::config::presets::load_config("8gb").unwrap();
    config.set_all(&["data.preprocess.load_size=128".into(), "data.preprocess.crop_size=112".into()]).unwrap();
    let pass = super::Pass::in_order(5, 2, 17);
    let plain = Arc::new(super::SamplePipeline::from_config(&config, true));
    let cache = Arc::new(crate::data::image_cache::ImageCache::new(1 << 30, 1 << 30, Some(dir.path().join("cache"))));
    let cached = Arc::new(super::SamplePipeline::from_config(&config, true).with_cache(Some(cache.clone())));
    let run = |pipe: &Arc<super::SamplePipeline>| {
        super::batches(dataset.clone(), pipe.clone(), pass.clone(), 2, 2)
            .map(|b| (b.images, b.labels, b.skipped.len()))
            .collect::<Vec<_>>()
    };
    let want = run(&plain);
    assert_eq!(want.iter().map(|b| b.1.len()).sum::<usize>(), 5);
    assert_eq!(run(&cached), want, "first pass: decoded and stored");
    assert_eq!(run(&cached), want, "second pass: from RAM");
    let s = cache.stats();
    assert_eq!((s.misses, s.ram_hits, s.disk_hits), (5, 5, 0));
    // A new run on the same folder reads the disk tier.
    let disk = Arc::new(crate::data::image_cache::ImageCache::new(0, 1 << 30, Some(dir.path().join("cache"))));
    let later = Arc::new(super::SamplePipeline::from_config(&config, true).with_cache(Some(disk.clone())));
    assert_eq!(run(&later), want, "from disk");
    assert_eq!((disk.stats().misses, disk.stats().disk_hits), (0, 5));
}

#[test]
fn a_pass_built_on_the_iterating_thread_gives_the_workers_batches() {
    use std::sync::Arc;
    let dir = tempfile::tempdir().unwrap();
    let paths = crate::bench::loader::write_photos(dir.path(), 96, 80, 7, 3).unwrap();
    let dataset = Arc::new(crate::bench::loader::dataset_of(paths));
    let mut config = crate::config::presets::load_config("8gb").unwrap();
    config.set_all(&["data.preprocess.load_size=72".into(), "data.preprocess.crop_size=64".into()]).unwrap();
    let pipe = Arc::new(super::SamplePipeline::from_config(&config, true));
    // Seven images in batches of 3 from the second batch on: a random order, augmentation
    // on, a short last batch.
    let pass = super::Pass {
        order: Arc::new(vec![6, 2, 4, 0, 1, 5, 3]),
        batch_size: 3,
        skip_batches: 1,
        seed: 9,
        repeats: false,
    };
    let key = |b: super::Batch| (b.images, b.labels, b.height, b.width);
    let workers: Vec<_> = super::batches(dataset.clone(), pipe.clone(), pass.clone(), 2, 2).map(key).collect();
    let inline: Vec<_> = super::batches_on_this_thread(dataset, pipe, pass).map(key).collect();
    assert_eq!(workers.iter().map(|b| b.1.len()).collect::<Vec<_>>(), vec![3, 1]);
    assert!(workers[0].0.iter().any(|&v| v != 0.0));
    assert_eq!(inline, workers);
}

#[test]
fn a_device_batch_holds_the_cpu_paths_random_crops_as_8_bit_pixels_and_splits_alike() {
    use std::sync::Arc;
    let dir = tempfile::tempdir().unwrap();
    // Mode `crop` from 64x48 photos: the batch carries 32x32 crops, never the sources.
    let paths = crate::bench::loader::write_photos(dir.path(), 64, 48, 5, 4).unwrap();
    let dataset = Arc::new(crate::bench::loader::dataset_of(paths));
    let mut config = crate::config::presets::load_config("8gb").unwrap();
    config.set_all(&["data.preprocess.mode=crop".into(), "data.preprocess.crop_size=32".into()]).unwrap();
    config.augment = crate::config::AugmentConfig {
        random_crop: true,
        hflip: false,
        color_jitter: 0.0,
        random_erasing: 0.0,
        on_device: true,
    };
    let (mean, std) = (config.data.mean, config.data.std);
    let pass = super::Pass::in_order(5, 5, 9);
    let cpu = Arc::new(super::SamplePipeline::from_config(&config, true));
    let device = Arc::new(super::SamplePipeline::from_config(&config, true).with_device_augment(true));
    let want = super::batches(dataset.clone(), cpu, pass.clone(), 1, 1).next().unwrap();
    let got = super::batches(dataset, device, pass, 1, 1).next().unwrap();
    let packed = got.packed.clone().expect("packed for the device");
    assert!(got.images.is_empty() && want.packed.is_none());
    assert_eq!((got.labels.clone(), got.height, got.width), (want.labels.clone(), 32, 32));
    assert_eq!(packed.pixels.len(), 5 * 32 * 32);
    assert!(packed.augments.iter().all(|a| a.crop_origin == (0, 0)));
    // With no other augmentation, normalizing the packed crops gives the CPU path's values:
    // the same random crop from the same generator.
    let plane = 32 * 32;
    for (p, &px) in packed.pixels.iter().enumerate() {
        let (image, pixel) = (p / plane, p % plane);
        for c in 0..3 {
            let v = ((px >> (8 * c)) & 0xff) as f32 / 255.0;
            let cpu_value = want.images[image * 3 * plane + c * plane + pixel];
            assert!(((v - mean[c]) / std[c] - cpu_value).abs() < 1e-5, "image {image} pixel {pixel}");
        }
    }
    let pieces = got.split(2);
    assert_eq!(pieces.iter().map(Batch::len).collect::<Vec<_>>(), vec![3, 2]);
    let second = pieces[1].packed.as_ref().unwrap();
    assert_eq!(second.pixels, packed.pixels[3 * plane..]);
    assert_eq!(second.augments, packed.augments[3..]);
}

#[test]
fn split_edges_empty_one_and_more_parts_than_images() {
    assert!(batch(0).split(4).is_empty(), "an all-skipped batch yields nothing to run");
    assert_eq!(batch(5).split(1).len(), 1);
    assert_eq!(batch(2).split(8).iter().map(Batch::len).collect::<Vec<_>>(), vec![1, 1]);
}

#[test]
fn a_class_balanced_epoch_draws_classes_evenly_and_is_seeded() {
    // 60 samples of class 0 and 3 of class 1 (C34's shape).
    let labels: Vec<usize> = (0..63).map(|i| usize::from(i >= 60)).collect();
    let pass = super::Pass::class_balanced_epoch(&labels, 8, 5, 0, 0);
    assert_eq!(pass.order.len(), 63);
    assert!(pass.repeats);
    let rare = pass.order.iter().filter(|&&i| labels[i] == 1).count();
    // Binomial(63, 1/2): 31.5 expected, outside 20..=43 has probability under 1e-3.
    assert!((20..=43).contains(&rare), "{rare} of 63 draws from the rare class");
    assert_eq!(pass.order, super::Pass::class_balanced_epoch(&labels, 8, 5, 0, 0).order, "seeded");
    assert_ne!(pass.order, super::Pass::class_balanced_epoch(&labels, 8, 5, 1, 0).order, "each epoch its own draw");
}
