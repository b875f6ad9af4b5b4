//! What the duplicate finder knows of one image: a hash of its file's bytes, a hash of its
//! decoded pixels, and a 64-bit perceptual hash of the picture and of its mirror image.
//!
//! # The perceptual hash
//! The DCT hash of Zauner ("Implementation and Benchmarking of Perceptual Image Hash
//! Functions", 2010; the `imagehash` package's `phash`): the image as grey (ITU-R 601 luma),
//! box-averaged to 32 x 32, its 2-D DCT-II, and of the 8 x 8 lowest frequencies one bit each:
//! set when the coefficient is above their median. Resizing, re-compression and small crops move
//! the low frequencies little, so copies differ in few bits; unrelated pictures differ in about
//! half. [`NEAR_BITS`] is the threshold, chosen by `vramfit bench duplicates` (docs/data-health.md).
//!
//! A horizontal mirror negates the coefficients of odd horizontal frequency (the DCT-II basis
//! `cos(pi (2x + 1) u / 64)` at `x -> 31 - x` is `(-1)^u` times itself), so the mirror image's
//! hash comes from the same coefficients: a mirrored copy is found without decoding it twice.

use image::RgbImage;
use xxhash_rust::xxh3::xxh3_128;

/// Two perceptual hashes at most this many bits apart (of 64) are the same picture. Measured by
/// `vramfit bench duplicates` on Fashion-MNIST (docs/data-health.md): at 10 bits every resized,
/// re-encoded (JPEG quality 50-95) and 5%-cropped copy was found, and distinct images matched in
/// about 0.1 of each thousand pairs.
pub const NEAR_BITS: u32 = 10;

/// The side the image is averaged down to before the DCT.
const SIDE: usize = 32;

/// Frequencies kept per axis (8 x 8 = 64 bits).
const FREQS: usize = 8;

/// One image's hashes.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub struct ImageHashes {
    /// xxh3-128 of the file's bytes (an IDX image: of its pixels): byte-identical copies.
    pub bytes: u128,
    /// xxh3-128 of the decoded RGB pixels and their size: the same picture saved again
    /// (another PNG encoder, other metadata) with every pixel equal.
    pub pixels: u128,
    /// The 64-bit DCT perceptual hash (module docs).
    pub perceptual: u64,
    /// The perceptual hash of the image mirrored left to right.
    pub mirrored: u64,
    /// The picture is one flat grey level (within [`FLAT_GREY_STD`]): its perceptual hash is
    /// rounding noise, so it is matched by its pixels only (check-data names flat images apart).
    pub flat: bool,
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
        Self { bytes: xxh3_128(bytes), pixels: xxh3_128(&pixel_key), perceptual, mirrored, flat: is_flat(&grey) }
    }
}

/// Bits in which two perceptual hashes differ.
pub fn distance(a: u64, b: u64) -> u32 {
    (a ^ b).count_ones()
}

/// The perceptual hash of `img` and of its mirror image (module docs).
pub fn perceptual_hashes(img: &RgbImage) -> (u64, u64) {
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
fn hashes_of_grey(grey: &[f32]) -> (u64, u64) {
    let coefficients = low_dct(grey);
    let mirrored: Vec<f32> =
        coefficients.iter().enumerate().map(|(i, &c)| if (i % FREQS) % 2 == 1 { -c } else { c }).collect();
    (bits_above_median(&coefficients), bits_above_median(&mirrored))
}

/// `img` as ITU-R 601 luma (0..255), averaged over boxes to `SIDE x SIDE`, row-major. Box `i`
/// covers source rows (or columns) `i * n / SIDE .. (i + 1) * n / SIDE`, at least one; an image
/// smaller than `SIDE` repeats its pixels.
fn box_grey(img: &RgbImage) -> Vec<f32> {
    let (w, h) = (img.width() as usize, img.height() as usize);
    let raw = img.as_raw();
    let bounds = |i: usize, n: usize| {
        let start = i * n / SIDE;
        (start, ((i + 1) * n / SIDE).max(start + 1).min(n))
    };
    let mut out = vec![0f32; SIDE * SIDE];
    for by in 0..SIDE {
        let (y0, y1) = bounds(by, h);
        for bx in 0..SIDE {
            let (x0, x1) = bounds(bx, w);
            let mut sum = 0f32;
            for y in y0..y1 {
                let row = &raw[(y * w + x0) * 3..(y * w + x1) * 3];
                for p in row.chunks_exact(3) {
                    sum += 0.299 * f32::from(p[0]) + 0.587 * f32::from(p[1]) + 0.114 * f32::from(p[2]);
                }
            }
            out[by * SIDE + bx] = sum / ((y1 - y0) * (x1 - x0)) as f32;
        }
    }
    out
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
            rows[y * FREQS + u] =
                (0..SIDE).map(|x| basis[u * SIDE + x] * grey[y * SIDE + x]).sum();
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
fn bits_above_median(values: &[f32]) -> u64 {
    let mut sorted = values.to_vec();
    sorted.sort_by(f32::total_cmp);
    let median = (sorted[sorted.len() / 2 - 1] + sorted[sorted.len() / 2]) / 2.0;
    values.iter().enumerate().fold(0u64, |bits, (i, &v)| if v > median { bits | (1 << i) } else { bits })
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A smooth test picture with structure at several scales.
    fn picture(w: u32, h: u32, phase: f32) -> RgbImage {
        RgbImage::from_fn(w, h, |x, y| {
            let (fx, fy) = (x as f32 / w as f32, y as f32 / h as f32);
            let v = 128.0 + 60.0 * (6.0 * fx + phase).sin() * (3.0 * fy).cos() + 40.0 * (fx * fy * 9.0).sin();
            image::Rgb([v as u8, (v * 0.8) as u8, (255.0 - v) as u8])
        })
    }

    #[test]
    fn the_mirror_hash_is_the_hash_of_the_mirrored_image() {
        let img = picture(64, 48, 0.3);
        let flipped = image::imageops::flip_horizontal(&img);
        let (p, m) = perceptual_hashes(&img);
        let (fp, fm) = perceptual_hashes(&flipped);
        assert!(distance(m, fp) <= 2, "mirror {m:016x} vs flipped {fp:016x}");
        assert!(distance(p, fm) <= 2);
        assert!(distance(p, fp) > NEAR_BITS, "an asymmetric picture differs from its mirror image");
    }

    #[test]
    fn a_resized_copy_is_near_and_another_picture_is_far() {
        let img = picture(96, 96, 0.0);
        let small = image::imageops::resize(&img, 40, 40, image::imageops::FilterType::Triangle);
        let other = RgbImage::from_fn(96, 96, |x, y| {
            let r = ((x as f32 - 30.0).powi(2) + (y as f32 - 60.0).powi(2)).sqrt();
            let v = (128.0 + 100.0 * (r / 9.0).sin()) as u8;
            image::Rgb([v, v, v])
        });
        let (a, _) = perceptual_hashes(&img);
        assert!(distance(a, perceptual_hashes(&small).0) <= 4);
        let far = distance(a, perceptual_hashes(&other).0);
        assert!(far > 2 * NEAR_BITS, "{far} bits apart");
    }

    #[test]
    fn bytes_and_pixels_hash_what_they_name() {
        let img = picture(8, 8, 0.0);
        let a = ImageHashes::of(b"file one", &img);
        let b = ImageHashes::of(b"file two", &img);
        assert_ne!(a.bytes, b.bytes);
        assert_eq!(a.pixels, b.pixels);
        let mut changed = img.clone();
        changed.put_pixel(3, 3, image::Rgb([0, 0, 1]));
        assert_ne!(ImageHashes::of(b"file one", &changed).pixels, a.pixels);
    }

    #[test]
    fn flat_and_tiny_images_are_flat() {
        let one = RgbImage::from_pixel(1, 1, image::Rgb([9, 9, 9]));
        assert!(ImageHashes::of(b"x", &one).flat);
        assert!(ImageHashes::of(b"x", &RgbImage::from_pixel(50, 30, image::Rgb([200, 10, 10]))).flat);
        assert!(!ImageHashes::of(b"x", &picture(50, 30, 0.0)).flat);
    }
}
