//! What the duplicate finder knows of one image: a hash of its file's bytes, a hash of its
//! decoded pixels, and a 256-bit perceptual hash of the picture and of its mirror image.
//!
//! # The perceptual hash
//! The DCT hash of Zauner ("Implementation and Benchmarking of Perceptual Image Hash
//! Functions", 2010; the `imagehash` package's `phash`), with more frequencies: the image as grey
//! (ITU-R 601 luma), area-averaged to 32 x 32, its 2-D DCT-II, and of the 16 x 16 lowest
//! frequencies one bit each, set when the coefficient is above their median. 256 bits because
//! the usual 8 x 8 = 64 matched 3,200 in a million pairs of distinct Fashion-MNIST items at the
//! threshold that finds resized copies; area weights (partly covered pixels weighed by their
//! share) because whole pixels per box made 3% of half-size copies differ in their high
//! frequencies. Resizing and re-compression move the low frequencies little, so copies
//! differ in few bits; unrelated pictures differ in about half. [`NEAR_BITS`] is the threshold,
//! chosen by `vramfit bench duplicates` (docs/data-health.md).
//!
//! A horizontal mirror negates the coefficients of odd horizontal frequency (the DCT-II basis
//! `cos(pi (2x + 1) u / 64)` at `x -> 31 - x` is `(-1)^u` times itself), so the mirror image's
//! hash comes from the same coefficients: a mirrored copy is found without decoding it twice.

use image::RgbImage;
use xxhash_rust::xxh3::xxh3_128;

/// Two perceptual hashes at most this many bits apart (of 256) are the same picture. Chosen with
/// `vramfit bench duplicates --pictures 6000` (docs/data-health.md): at 24 bits every resized
/// (0.5x-1.5x) and mirrored copy and 99.9% of JPEG re-encodes at quality 50 (all at 75 and 95)
/// were found, while 2 of 18 million pairs of distinct Fashion-MNIST items matched (a hard case:
/// centred items of one kind on black); the same holds from 12 bits, and 24 leaves room for
/// what the bench does not make (other resamplers, colour edits). Crops move the frame, which a
/// hash of the whole picture cannot follow: a 5% crop is not found.
pub const NEAR_BITS: u32 = 24;

/// The side the image is averaged down to before the DCT.
const SIDE: usize = 32;

/// Frequencies kept per axis (16 x 16 = 256 bits).
const FREQS: usize = 16;

/// 64-bit words of a perceptual hash.
pub const WORDS: usize = FREQS * FREQS / 64;

/// A perceptual hash: one bit per kept DCT coefficient, bit `i` in word `i / 64`.
pub type Perceptual = [u64; WORDS];

/// One image's hashes.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub struct ImageHashes {
    /// xxh3-128 of the file's bytes (an IDX image: of its pixels): byte-identical copies.
    pub bytes: u128,
    /// xxh3-128 of the decoded RGB pixels and their size: the same picture saved again
    /// (another PNG encoder, other metadata) with every pixel equal.
    pub pixels: u128,
    /// The 64-bit DCT perceptual hash (module docs).
    pub perceptual: Perceptual,
    /// The perceptual hash of the image mirrored left to right.
    pub mirrored: Perceptual,
    /// The picture is one flat grey level (within [`FLAT_GREY_STD`]): its perceptual hash is
    /// rounding noise, so it is matched by its pixels only (check-data names flat images apart).
    pub flat: bool,
    /// The mean colour (RGB, 0..255): the perceptual hash sees grey only, and copies keep their
    /// colours ([`super::duplicates::colours_match`]).
    pub colour: [u8; 3],
}

impl ImageHashes {
    /// The hashes of an image whose encoded form is `bytes` and decoded form `img`.
    pub fn of(bytes: &[u8], img: &RgbImage) -> Self {
        let mut pixel_key = Vec::with_capacity(img.as_raw().len() + 8);
        pixel_key.extend_from_slice(&img.width().to_le_bytes());
        pixel_key.extend_from_slice(&img.height().to_le_bytes());
        pixel_key.extend_from_slice(img.as_raw());
        let grey = box_grey(img);
        let (perceptual, mirrored) = hashes_of_grey(&grey);
        Self {
            bytes: xxh3_128(bytes),
            pixels: xxh3_128(&pixel_key),
            perceptual,
            mirrored,
            flat: is_flat(&grey),
            colour: mean_colour(img),
        }
    }
}

/// The mean of each channel of `img` (0 for an empty image).
fn mean_colour(img: &RgbImage) -> [u8; 3] {
    let mut sums = [0u64; 3];
    for p in img.as_raw().chunks_exact(3) {
        for c in 0..3 {
            sums[c] += u64::from(p[c]);
        }
    }
    let n = (u64::from(img.width()) * u64::from(img.height())).max(1);
    sums.map(|s| (s / n) as u8)
}

/// Bits in which two perceptual hashes differ.
pub fn distance(a: &Perceptual, b: &Perceptual) -> u32 {
    a.iter().zip(b).map(|(x, y)| (x ^ y).count_ones()).sum()
}

/// The perceptual hash of `img` and of its mirror image (module docs).
pub fn perceptual_hashes(img: &RgbImage) -> (Perceptual, Perceptual) {
    hashes_of_grey(&box_grey(img))
}

/// Standard deviation (grey levels, 0..255) under which an averaged image is flat.
pub const FLAT_GREY_STD: f32 = 1.0;

/// Whether the averaged grey image varies by less than [`FLAT_GREY_STD`].
fn is_flat(grey: &[f32]) -> bool {
    let n = grey.len() as f32;
    let mean = grey.iter().sum::<f32>() / n;
    let var = grey.iter().map(|g| (g - mean) * (g - mean)).sum::<f32>() / n;
    var.sqrt() < FLAT_GREY_STD
}

/// The perceptual hashes of an image already averaged by [`box_grey`].
fn hashes_of_grey(grey: &[f32]) -> (Perceptual, Perceptual) {
    let coefficients = low_dct(grey);
    let mirrored: Vec<f32> =
        coefficients.iter().enumerate().map(|(i, &c)| if (i % FREQS) % 2 == 1 { -c } else { c }).collect();
    (bits_above_median(&coefficients), bits_above_median(&mirrored))
}

/// `img` as ITU-R 601 luma (0..255), area-averaged to `SIDE x SIDE`, row-major: output pixel
/// `i` covers source `[i * n / SIDE, (i + 1) * n / SIDE)` on each axis, partly covered pixels
/// weighted by their share (an image smaller than `SIDE` is stretched). Separable: rows, then
/// columns.
fn box_grey(img: &RgbImage) -> Vec<f32> {
    let (w, h) = (img.width() as usize, img.height() as usize);
    let luma: Vec<f32> = img
        .as_raw()
        .chunks_exact(3)
        .map(|p| 0.299 * f32::from(p[0]) + 0.587 * f32::from(p[1]) + 0.114 * f32::from(p[2]))
        .collect();
    let (wx, wy) = (area_weights(w), area_weights(h));
    let mut rows = vec![0f32; h * SIDE];
    for y in 0..h {
        for (bx, taps) in wx.iter().enumerate() {
            rows[y * SIDE + bx] = taps.iter().map(|&(x, t)| t * luma[y * w + x]).sum();
        }
    }
    let mut out = vec![0f32; SIDE * SIDE];
    for (by, taps) in wy.iter().enumerate() {
        for bx in 0..SIDE {
            out[by * SIDE + bx] = taps.iter().map(|&(y, t)| t * rows[y * SIDE + bx]).sum();
        }
    }
    out
}

/// For each of the `SIDE` output pixels of an axis of `n` source pixels, the source pixels it
/// covers and their weights (summing to 1).
fn area_weights(n: usize) -> Vec<Vec<(usize, f32)>> {
    (0..SIDE)
        .map(|i| {
            let (a, b) = (i as f64 * n as f64 / SIDE as f64, (i + 1) as f64 * n as f64 / SIDE as f64);
            (a.floor() as usize..(b.ceil() as usize).min(n))
                .filter_map(|x| {
                    let overlap = b.min(x as f64 + 1.0) - a.max(x as f64);
                    (overlap > 0.0).then(|| (x, (overlap / (b - a)) as f32))
                })
                .collect()
        })
        .collect()
}

/// The `FREQS x FREQS` lowest coefficients of the 2-D DCT-II of a `SIDE x SIDE` image,
/// `[v * FREQS + u]` with `u` the horizontal frequency (unnormalized: the hash compares them
/// with each other only).
fn low_dct(grey: &[f32]) -> Vec<f32> {
    let basis: Vec<f32> = (0..FREQS)
        .flat_map(|k| {
            (0..SIDE).map(move |x| (std::f32::consts::PI * (2 * x + 1) as f32 * k as f32 / (2 * SIDE) as f32).cos())
        })
        .collect();
    // Rows first: rows[y][u] = sum_x basis[u][x] grey[y][x].
    let mut rows = vec![0f32; SIDE * FREQS];
    for y in 0..SIDE {
        for u in 0..FREQS {
            rows[y * FREQS + u] = (0..SIDE).map(|x| basis[u * SIDE + x] * grey[y * SIDE + x]).sum();
        }
    }
    let mut out = vec![0f32; FREQS * FREQS];
    for v in 0..FREQS {
        for u in 0..FREQS {
            out[v * FREQS + u] = (0..SIDE).map(|y| basis[v * SIDE + y] * rows[y * FREQS + u]).sum();
        }
    }
    out
}

/// Bit `i` set when `values[i]` is above the median of `values` (64 values).
fn bits_above_median(values: &[f32]) -> Perceptual {
    let mut sorted = values.to_vec();
    sorted.sort_by(f32::total_cmp);
    let median = (sorted[sorted.len() / 2 - 1] + sorted[sorted.len() / 2]) / 2.0;
    let mut bits = [0u64; WORDS];
    for (i, &v) in values.iter().enumerate() {
        if v > median {
            bits[i / 64] |= 1 << (i % 64);
        }
    }
    bits
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A test picture: 12 rectangles of random colours (seeded) on grey, so it has structure at
    /// every scale, as photos do (a smooth picture leaves most of the 256 coefficients near the
    /// median, where bits are noise).
    fn picture(w: u32, h: u32, seed: u64) -> RgbImage {
        use rand::{Rng, SeedableRng};
        let mut rng = rand::rngs::SmallRng::seed_from_u64(seed);
        let mut img = RgbImage::from_pixel(w, h, image::Rgb([128, 128, 128]));
        for _ in 0..12 {
            let (x0, y0) = (rng.random_range(0..w), rng.random_range(0..h));
            let (x1, y1) = (rng.random_range(x0..=w), rng.random_range(y0..=h));
            let colour = image::Rgb([rng.random(), rng.random(), rng.random()]);
            for y in y0..y1 {
                for x in x0..x1 {
                    img.put_pixel(x, y, colour);
                }
            }
        }
        img
    }

    #[test]
    fn the_mirror_hash_is_the_hash_of_the_mirrored_image() {
        let img = picture(64, 48, 3);
        let flipped = image::imageops::flip_horizontal(&img);
        let (p, m) = perceptual_hashes(&img);
        let (fp, fm) = perceptual_hashes(&flipped);
        assert!(distance(&m, &fp) <= 2, "mirror {m:x?} vs flipped {fp:x?}");
        assert!(distance(&p, &fm) <= 2);
        assert!(distance(&p, &fp) > NEAR_BITS, "an asymmetric picture differs from its mirror image");
    }

    #[test]
    fn a_resized_copy_is_near_and_another_picture_is_far() {
        let img = picture(96, 96, 1);
        let small = image::imageops::resize(&img, 40, 40, image::imageops::FilterType::Triangle);
        let other = picture(96, 96, 2);
        let (a, _) = perceptual_hashes(&img);
        assert!(distance(&a, &perceptual_hashes(&small).0) <= NEAR_BITS / 2);
        let far = distance(&a, &perceptual_hashes(&other).0);
        assert!(far > 2 * NEAR_BITS, "{far} bits apart");
    }

    #[test]
    fn bytes_and_pixels_hash_what_they_name() {
        let img = picture(8, 8, 0);
        let a = ImageHashes::of(b"file one", &img);
        let b = ImageHashes::of(b"file two", &img);
        assert_ne!(a.bytes, b.bytes);
        assert_eq!(a.pixels, b.pixels);
        let mut changed = img.clone();
        changed.put_pixel(3, 3, image::Rgb([0, 0, 1]));
        assert_ne!(ImageHashes::of(b"file one", &changed).pixels, a.pixels);
    }

    #[test]
    fn area_weights_cover_each_axis_once() {
        for n in [1, 7, 28, 32, 33, 100] {
            let weights = area_weights(n);
            let mut per_source = vec![0f64; n];
            for taps in &weights {
                assert!((taps.iter().map(|t| f64::from(t.1)).sum::<f64>() - 1.0).abs() < 1e-5, "n {n}");
                for &(x, t) in taps {
                    per_source[x] += f64::from(t) * n as f64 / SIDE as f64;
                }
            }
            assert!(per_source.iter().all(|&c| (c - 1.0).abs() < 1e-4), "n {n}: {per_source:?}");
        }
    }

    #[test]
    fn flat_and_tiny_images_are_flat() {
        let one = RgbImage::from_pixel(1, 1, image::Rgb([9, 9, 9]));
        assert!(ImageHashes::of(b"x", &one).flat);
        assert!(ImageHashes::of(b"x", &RgbImage::from_pixel(50, 30, image::Rgb([200, 10, 10]))).flat);
        assert!(!ImageHashes::of(b"x", &picture(50, 30, 0)).flat);
    }
}
