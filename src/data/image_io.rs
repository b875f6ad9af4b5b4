//! The one image-loading path for training, evaluation and prediction.
//!
//! Rules, in order:
//! 1. The format comes from the content, never from the extension.
//! 2. The header's dimensions are checked against a pixel cap before anything is decoded, and
//!    the `image` crate's allocation limits are set on the decoder itself (its `from_decoder`
//!    path would otherwise skip them).
//! 3. EXIF orientation is applied.
//! 4. Every colour type becomes 8-bit RGB; transparent pixels are composited by [`AlphaPolicy`]
//!    (default: over white). Animated files give their first frame.
//! 5. A JPEG whose entropy-coded data ends early (which the decoder would fill with invented
//!    rows) is an error; one missing only its end-of-image marker is accepted.

use std::io::Cursor;
use std::path::Path;

use image::{DynamicImage, ImageDecoder, ImageFormat, ImageReader, Limits, RgbImage};
use serde::{Deserialize, Serialize};

pub use crate::engine::error::ImageFault;
use crate::engine::error::{Error, Result};

/// What transparent pixels become. The same rule is used for training and prediction.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum AlphaPolicy {
    /// Composite over white: `c * a + 255 * (1 - a)`.
    #[default]
    White,
    /// Composite over black: `c * a`.
    Black,
    /// Ignore alpha and keep the stored colour.
    Drop,
}

impl AlphaPolicy {
    /// The config value: `white`, `black` or `drop`.
    pub fn name(self) -> &'static str {
        match self {
            AlphaPolicy::White => "white",
            AlphaPolicy::Black => "black",
            AlphaPolicy::Drop => "drop",
        }
    }
}

/// Decoding options.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct LoadOptions {
    /// Largest width x height accepted, read from the header before decoding.
    pub max_pixels: u64,
    /// Transparent-pixel rule.
    pub alpha: AlphaPolicy,
}

impl Default for LoadOptions {
    fn default() -> Self {
        Self { max_pixels: 64_000_000, alpha: AlphaPolicy::White }
    }
}

/// Reads and decodes the image file at `path`.
///
/// # Errors
/// [`Error::Image`] naming `path`, with the [`ImageFault`]: unreadable, empty, not an image,
/// unsupported (HEIC, AVIF, JPEG XL), over the pixel cap, truncated or corrupt.
pub fn load_image(path: &Path, opts: &LoadOptions) -> Result<RgbImage> {
    load_image_scaled(path, opts, u32::MAX)
}

/// [`load_image`] through [`decode_image_scaled`]: a large JPEG decodes at a reduced DCT scale
/// that keeps both sides at least `min_side` pixels.
///
/// # Errors
/// As [`load_image`].
pub fn load_image_scaled(path: &Path, opts: &LoadOptions, min_side: u32) -> Result<RgbImage> {
    let image_err = |fault| Error::Image { path: path.into(), fault };
    let bytes = std::fs::read(path).map_err(|e| image_err(ImageFault::Unreadable(e.to_string())))?;
    decode_image_scaled(&bytes, opts, min_side).map_err(image_err)
}

/// Decodes encoded image bytes to RGB. See the module docs for the rules.
///
/// # Errors
/// The [`ImageFault`] (the caller adds the file name).
pub fn decode_image(bytes: &[u8], opts: &LoadOptions) -> std::result::Result<RgbImage, ImageFault> {
    decode_image_scaled(bytes, opts, u32::MAX)
}

/// [`decode_image`], except that a JPEG at least twice `min_side` pixels on both sides is
/// decoded at a reduced DCT scale: the smallest of 1/8, 1/4 and 1/2 that keeps both sides at
/// least `min_side` (libjpeg's scaled IDCT, through `jpeg-decoder`). The IDCT then skips the
/// high frequencies a later downscale to `min_side` would average away, so a 12 MP photo
/// bound for 256 px decodes 1/64 of the pixels. After the same resize to 256 px the result
/// differs from a full decode's by 0.3-0.5 grey levels on average and at most 7 (test
/// `scaled_decode_matches_full_decode_after_the_same_resize`: at most 1 and 12).
///
/// `u32::MAX` never scales. Files the scaled decoder rejects (or that make it panic) fall back
/// to the full decode, which gives the typed fault. Without its `rayon` feature, `jpeg-decoder`
/// decodes the colour components of an image of 128 x 128 or more on threads of its own, so a
/// loader worker briefly uses up to three threads.
///
/// # Errors
/// The [`ImageFault`] (the caller adds the file name).
pub fn decode_image_scaled(
    bytes: &[u8],
    opts: &LoadOptions,
    min_side: u32,
) -> std::result::Result<RgbImage, ImageFault> {
    if bytes.is_empty() {
        return Err(ImageFault::Empty);
    }
    // A format the image crate recognises but was built without (AVIF) is described like one it
    // does not know, naming the format.
    let format = match image::guess_format(bytes) {
        Ok(format) if format.reading_enabled() => format,
        _ => return Err(describe_unknown(bytes)),
    };
    let (width, height) = header_dimensions(bytes, format)?;
    if width as u64 * height as u64 > opts.max_pixels {
        return Err(ImageFault::OverPixelCap { width, height, max_pixels: opts.max_pixels });
    }
    if format == ImageFormat::Jpeg {
        let scaled = || dct_scale(width, height, min_side).and_then(|scale| decode_jpeg_scaled(bytes, scale));
        // A file that ends with its end marker cannot have been cut short (entropy-coded data
        // never holds `FF D9`: a coded `FF` is followed by `00` or a restart marker), so on the
        // scaled path the scaled decoder's own errors are its only check; a file it refuses
        // goes on to the strict check below. Until this path existed every JPEG was decoded
        // in full once more by that check, most of a 12 MP photo's load time (README, "The
        // input pipeline").
        let whole = bytes.ends_with(&[0xFF, 0xD9]);
        if whole && let Some(img) = scaled() {
            return Ok(img);
        }
        check_jpeg_complete(bytes)?;
        if !whole && let Some(img) = scaled() {
            return Ok(img);
        }
    }
    let corrupt = |e: image::ImageError| ImageFault::Corrupt { format: format!("{format:?}"), message: e.to_string() };
    let mut reader = ImageReader::with_format(Cursor::new(bytes), format);
    reader.limits(limits_for(opts));
    let mut decoder = reader.into_decoder().map_err(corrupt)?;
    let orientation = decoder.orientation().unwrap_or(image::metadata::Orientation::NoTransforms);
    let mut img = DynamicImage::from_decoder(decoder).map_err(corrupt)?;
    img.apply_orientation(orientation);
    Ok(to_rgb(img, opts.alpha))
}

/// The DCT scale denominator (2, 4 or 8) for a `width` x `height` JPEG that must stay at least
/// `min_side` on both sides, or `None` when only the full size does. A side of `n` pixels
/// decodes to `ceil(n / scale)`.
fn dct_scale(width: u32, height: u32, min_side: u32) -> Option<u32> {
    [8, 4, 2].into_iter().find(|&k| width.div_ceil(k) >= min_side && height.div_ceil(k) >= min_side)
}

/// A JPEG decoded at `1/scale` of its size (8-bit grey or RGB; anything else, an error or a
/// panic inside the decoder gives `None`), with its EXIF orientation applied.
fn decode_jpeg_scaled(bytes: &[u8], scale: u32) -> Option<RgbImage> {
    let decode = || -> Option<RgbImage> {
        let mut decoder = jpeg_decoder::Decoder::new(Cursor::new(bytes));
        decoder.read_info().ok()?;
        let info = decoder.info()?;
        let want = |n: u16| u16::try_from(u32::from(n).div_ceil(scale)).ok();
        // CMYK and 16-bit grey go to the full decode before any work is done.
        let grey = match info.pixel_format {
            jpeg_decoder::PixelFormat::RGB24 => false,
            jpeg_decoder::PixelFormat::L8 => true,
            _ => return None,
        };
        let (w, h) = decoder.scale(want(info.width)?, want(info.height)?).ok()?;
        let pixels = decoder.decode().ok()?;
        let rgb = if grey { pixels.iter().flat_map(|&v| [v, v, v]).collect() } else { pixels };
        RgbImage::from_raw(u32::from(w), u32::from(h), rgb)
    };
    // The image crate's decoder must accept the file too (it reads the EXIF orientation), so a
    // file the full path calls corrupt is never trained on through this one.
    let orientation = image::codecs::jpeg::JpegDecoder::new(Cursor::new(bytes)).ok()?.orientation().ok()?;
    let img = std::panic::catch_unwind(decode).ok()??;
    let mut img = DynamicImage::ImageRgb8(img);
    img.apply_orientation(orientation);
    Some(img.into_rgb8())
}

/// Width and height in pixels from the header alone (nothing is decoded).
///
/// # Errors
/// [`ImageFault::BadHeader`] when the header is unreadable.
pub fn header_dimensions(bytes: &[u8], format: ImageFormat) -> std::result::Result<(u32, u32), ImageFault> {
    let mut reader = ImageReader::with_format(Cursor::new(bytes), format);
    // No allocation limit here: only the header is parsed, and the cap is checked by the caller.
    reader.no_limits();
    reader
        .into_dimensions()
        .map_err(|e| ImageFault::BadHeader { format: format!("{format:?}"), message: e.to_string() })
}

fn limits_for(opts: &LoadOptions) -> Limits {
    let mut limits = Limits::default();
    // 4 bytes a pixel (RGBA8) plus headroom for 16-bit and the conversion copy.
    limits.max_alloc = Some(opts.max_pixels.saturating_mul(16).max(1 << 20));
    limits
}

/// Why bytes that no decoder here reads were rejected: a known format named by its signature
/// (ISO BMFF `ftyp` brands for HEIF/HEIC and AVIF, ISO/IEC 18181-2 for JPEG XL's codestream
/// `FF 0A` and container `00 00 00 0C 'JXL '`, Adobe's `8BPS` for Photoshop, an `<svg` element
/// in the first KiB), text, or neither.
fn describe_unknown(bytes: &[u8]) -> ImageFault {
    let unsupported = |format: String| ImageFault::Unsupported { format };
    if bytes.len() >= 12 && &bytes[4..8] == b"ftyp" {
        let brand = String::from_utf8_lossy(&bytes[8..12]).to_string();
        if ["avif", "avis"].contains(&brand.as_str()) {
            return unsupported(format!("AVIF image (brand `{brand}`)"));
        }
        if ["heic", "heix", "hevc", "heim", "heis", "mif1", "msf1"].contains(&brand.as_str()) {
            return unsupported(format!("HEIF/HEIC image (brand `{brand}`)"));
        }
    }
    if bytes.starts_with(&[0xFF, 0x0A]) || bytes.starts_with(b"\0\0\0\x0cJXL ") {
        return unsupported("JPEG XL image".into());
    }
    if bytes.starts_with(b"8BPS") {
        return unsupported("Photoshop document (PSD)".into());
    }
    let head = &bytes[..bytes.len().min(64)];
    let text_head = String::from_utf8_lossy(&bytes[..bytes.len().min(1024)]).to_ascii_lowercase();
    if text_head.contains("<svg") {
        return unsupported("SVG vector image".into());
    }
    if head.iter().all(|b| b.is_ascii_graphic() || b.is_ascii_whitespace()) {
        return ImageFault::NotAnImage("the file is text");
    }
    ImageFault::NotAnImage("content matches no supported format (jpeg, png, bmp, webp, gif, tiff)")
}

/// Rejects JPEGs whose entropy-coded data is cut short (decoders fill the missing rows with
/// invented pixels). A file missing only its final EOI marker is accepted.
///
/// Strict decoding must succeed (a bad Huffman code, a stray marker or a scan that ends early
/// fail it), possibly after appending the EOI marker; and a file that does not end with EOI must
/// have data down to the bottom of the image. That is tested by decoding it again with the last
/// eighth of its scan data removed: for a complete file the first changed row is in the bottom
/// part of the image, for a file cut at 60% it is above the middle. A full decode (two without
/// EOI): [`decode_image_scaled`] skips it for whole files its scaled decoder accepts.
fn check_jpeg_complete(bytes: &[u8]) -> std::result::Result<(), ImageFault> {
    let decode = |data: &[u8], strict: bool| {
        let options = zune_core::options::DecoderOptions::default().set_strict_mode(strict);
        let mut d = zune_jpeg::JpegDecoder::new_with_options(zune_core::bytestream::ZCursor::new(data), options);
        let pixels = d.decode()?;
        let (w, h) = d.dimensions().unwrap_or((0, 0));
        Ok::<_, zune_jpeg::errors::DecodeErrors>((pixels, w, h))
    };
    let truncated = |why: String| Err(ImageFault::TruncatedJpeg(why));
    let ends_with_eoi = bytes.ends_with(&[0xFF, 0xD9]);
    let mut with_eoi = bytes.to_vec();
    if !ends_with_eoi {
        with_eoi.extend_from_slice(&[0xFF, 0xD9]);
    }
    let (full, w, h) = match decode(&with_eoi, true) {
        Ok(r) => r,
        Err(e) => return truncated(e.to_string()),
    };
    let scan_start = bytes.windows(2).position(|m| m == [0xFF, 0xDA]).unwrap_or(0);
    let scan_len = bytes.len().saturating_sub(scan_start);
    if ends_with_eoi || scan_len < 16 || w == 0 || h < 16 {
        return Ok(());
    }
    // Cut a little more and see which rows change: only the last ones when the data was whole.
    let cut = (scan_len / 8).max(32).min(scan_len / 2);
    let mut shorter = bytes[..bytes.len() - cut].to_vec();
    shorter.extend_from_slice(&[0xFF, 0xD9]);
    let Ok((cut, cw, ch)) = decode(&shorter, false) else { return Ok(()) };
    if (cw, ch) != (w, h) || cut.len() != full.len() {
        return Ok(());
    }
    let row = full.len() / h;
    let first_changed = (0..h).find(|&y| full[y * row..(y + 1) * row] != cut[y * row..(y + 1) * row]);
    match first_changed {
        Some(y) if (y as f64) < 0.7 * h as f64 => {
            truncated(format!("no end marker and the data ends above row {} of {h}", y + h / 8))
        }
        _ => Ok(()),
    }
}

/// Converts any colour type to 8-bit RGB under `alpha`.
///
/// - An alpha channel that is 0 in every pixel is treated as unused (as browsers show such
///   files, e.g. 32-bit BMPs that leave the alpha byte zero): the colours are kept.
/// - Float images are scaled by their actual range: values within 0..1 as they are, anything
///   wider (a float TIFF holding 0..255) mapped from `min(0, lo)..max(1, hi)` to 0..255, never
///   clipped to white.
pub fn to_rgb(img: DynamicImage, alpha: AlphaPolicy) -> RgbImage {
    let img = rescale_float(img);
    if !img.color().has_alpha() || alpha == AlphaPolicy::Drop {
        return img.to_rgb8();
    }
    let rgba = img.to_rgba8();
    if rgba.pixels().all(|p| p.0[3] == 0) {
        return DynamicImage::ImageRgba8(rgba).to_rgb8();
    }
    let bg: u32 = if alpha == AlphaPolicy::White { 255 } else { 0 };
    let (w, h) = rgba.dimensions();
    let mut out = RgbImage::new(w, h);
    for (o, p) in out.pixels_mut().zip(rgba.pixels()) {
        let a = p.0[3] as u32;
        for c in 0..3 {
            o.0[c] = ((p.0[c] as u32 * a + bg * (255 - a) + 127) / 255) as u8;
        }
    }
    out
}

/// Float images with values outside 0..1 mapped into 0..1 by their range (see [`to_rgb`]).
fn rescale_float(img: DynamicImage) -> DynamicImage {
    let rescale = |values: &mut [f32]| {
        let (lo, hi) = values.iter().filter(|v| v.is_finite()).fold((0f32, 1f32), |(l, h), &v| (l.min(v), h.max(v)));
        if lo < 0.0 || hi > 1.0 {
            values.iter_mut().for_each(|v| *v = if v.is_finite() { (*v - lo) / (hi - lo) } else { 0.0 });
        }
    };
    match img {
        DynamicImage::ImageRgb32F(mut f) => {
            rescale(&mut f);
            DynamicImage::ImageRgb32F(f)
        }
        DynamicImage::ImageRgba32F(mut f) => {
            // Colour channels only; alpha keeps its meaning.
            let mut colour: Vec<f32> = f.pixels().flat_map(|p| [p.0[0], p.0[1], p.0[2]]).collect();
            rescale(&mut colour);
            for (p, c) in f.pixels_mut().zip(colour.chunks(3)) {
                p.0[..3].copy_from_slice(c);
            }
            DynamicImage::ImageRgba32F(f)
        }
        other => other,
    }
}

/// Whether a decoded image is one flat colour (every pixel equal): a blank or wrongly decoded
/// file, worth a warning naming it.
pub fn is_flat(img: &RgbImage) -> bool {
    let mut pixels = img.pixels();
    pixels.next().is_some_and(|first| pixels.all(|p| p == first))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn png_bytes(img: DynamicImage) -> Vec<u8> {
        let mut buf = Vec::new();
        img.write_to(&mut Cursor::new(&mut buf), ImageFormat::Png).unwrap();
        buf
    }

    /// A `w` x `h` photo-like JPEG (gradient, edges, noise) at quality 90, with an EXIF
    /// orientation tag when `orientation` is given.
    fn photo_jpeg(w: u32, h: u32, orientation: Option<u16>) -> Vec<u8> {
        let img = RgbImage::from_fn(w, h, |x, y| {
            let noise = ((x.wrapping_mul(7919) ^ y.wrapping_mul(104_729)) % 23) as u8;
            let edge = if (x / 97 + y / 61) % 2 == 0 { 60 } else { 0 };
            image::Rgb([(x * 200 / w) as u8 + noise, (y * 180 / h) as u8 + edge, 90 + noise])
        });
        let mut buf = Vec::new();
        image::codecs::jpeg::JpegEncoder::new_with_quality(&mut buf, 90).encode_image(&img).unwrap();
        if let Some(o) = orientation {
            // APP1 "Exif", big-endian TIFF, one IFD entry: Orientation (0x0112), SHORT, 1, o.
            let mut exif = b"Exif\0\0MM\0\x2a\0\0\0\x08\0\x01\x01\x12\0\x03\0\0\0\x01".to_vec();
            exif.extend_from_slice(&o.to_be_bytes());
            exif.extend_from_slice(&[0, 0, 0, 0, 0, 0]);
            let mut segment = vec![0xFF, 0xE1];
            segment.extend_from_slice(&(exif.len() as u16 + 2).to_be_bytes());
            segment.extend_from_slice(&exif);
            buf.splice(2..2, segment);
        }
        buf
    }

    /// Mean and largest absolute difference of two equal-sized images, in grey levels.
    fn difference(a: &RgbImage, b: &RgbImage) -> (f64, u8) {
        assert_eq!(a.dimensions(), b.dimensions());
        let d: Vec<u8> = a.as_raw().iter().zip(b.as_raw()).map(|(x, y)| x.abs_diff(*y)).collect();
        (d.iter().map(|&v| f64::from(v)).sum::<f64>() / d.len() as f64, d.iter().copied().max().unwrap_or(0))
    }

    #[test]
    fn scaled_decode_picks_the_smallest_scale_that_keeps_min_side() {
        assert_eq!(dct_scale(4000, 3000, 256), Some(8), "500x375");
        assert_eq!(dct_scale(1632, 1224, 256), Some(4), "408x306");
        assert_eq!(dct_scale(600, 500, 256), None, "300x250 at 1/2 is under 256");
        assert_eq!(dct_scale(4000, 3000, u32::MAX), None);
        assert_eq!(dct_scale(2049, 2049, 256), Some(8), "ceil(2049 / 8) = 257");
        let opts = LoadOptions::default();
        let img = decode_image_scaled(&photo_jpeg(1024, 768, None), &opts, 128).unwrap();
        assert_eq!(img.dimensions(), (256, 192), "1/4: 1/8 would give 96 rows");
    }

    #[test]
    fn scaled_decode_matches_full_decode_after_the_same_resize() {
        // What the loader does for resize_and_crop at load_size 256: decode (scaled or not),
        // then the same Triangle resize to 256 x 256.
        let opts = LoadOptions::default();
        for (w, h, orientation) in [(2400, 1800, None), (1800, 1100, Some(6)), (1300, 1300, Some(3))] {
            let bytes = photo_jpeg(w, h, orientation);
            let full = decode_image(&bytes, &opts).unwrap();
            let scaled = decode_image_scaled(&bytes, &opts, 256).unwrap();
            assert!(scaled.width() < full.width(), "{w}x{h} was not scaled");
            assert_eq!(
                (scaled.width() > scaled.height()),
                (full.width() > full.height()),
                "{w}x{h}, orientation {orientation:?}: EXIF rotation applied to both"
            );
            let resize = |img: &RgbImage| image::imageops::resize(img, 256, 256, image::imageops::FilterType::Triangle);
            let (mean, max) = difference(&resize(&full), &resize(&scaled));
            eprintln!("{w}x{h} decoded at {:?}: mean {mean:.3}, max {max} grey levels", scaled.dimensions());
            assert!(mean < 1.0 && max <= 12, "{w}x{h}: mean {mean:.2}, max {max} grey levels");
        }
    }

    #[test]
    fn a_small_or_non_jpeg_image_decodes_exactly_as_before() {
        let opts = LoadOptions::default();
        let bytes = photo_jpeg(300, 200, None);
        assert_eq!(decode_image_scaled(&bytes, &opts, 256).unwrap(), decode_image(&bytes, &opts).unwrap());
        let png = png_bytes(DynamicImage::ImageRgb8(RgbImage::from_pixel(900, 900, image::Rgb([1, 2, 3]))));
        assert_eq!(decode_image_scaled(&png, &opts, 64).unwrap().dimensions(), (900, 900));
    }

    #[test]
    fn an_all_zero_alpha_channel_is_unused_and_float_images_keep_their_range() {
        let mut rgba = image::RgbaImage::from_pixel(4, 4, image::Rgba([200, 10, 10, 0]));
        rgba.put_pixel(0, 3, image::Rgba([10, 10, 200, 0]));
        let rgb = to_rgb(DynamicImage::ImageRgba8(rgba), AlphaPolicy::White);
        assert_eq!((rgb.get_pixel(1, 1).0, rgb.get_pixel(0, 3).0), ([200, 10, 10], [10, 10, 200]));
        let float = image::Rgb32FImage::from_fn(2, 1, |x, _| image::Rgb([x as f32 * 255.0, 127.5, 0.0]));
        let rgb = to_rgb(DynamicImage::ImageRgb32F(float), AlphaPolicy::White);
        assert_eq!((rgb.get_pixel(0, 0).0, rgb.get_pixel(1, 0).0), ([0, 128, 0], [255, 128, 0]));
        assert!(is_flat(&RgbImage::from_pixel(3, 3, image::Rgb([255, 255, 255]))));
        assert!(!is_flat(&rgb));
    }

    #[test]
    fn rgba_composites_over_white_by_default() {
        let mut img = image::RgbaImage::new(2, 1);
        img.put_pixel(0, 0, image::Rgba([255, 0, 0, 255]));
        img.put_pixel(1, 0, image::Rgba([0, 0, 255, 0]));
        let out = decode_image(&png_bytes(DynamicImage::ImageRgba8(img.clone())), &LoadOptions::default()).unwrap();
        assert_eq!(out.get_pixel(0, 0).0, [255, 0, 0]);
        assert_eq!(out.get_pixel(1, 0).0, [255, 255, 255]);
        let black = LoadOptions { alpha: AlphaPolicy::Black, ..Default::default() };
        assert_eq!(
            decode_image(&png_bytes(DynamicImage::ImageRgba8(img)), &black).unwrap().get_pixel(1, 0).0,
            [0, 0, 0]
        );
    }

    #[test]
    fn small_truncated_jpegs_are_refused_and_a_missing_end_marker_is_not() {
        // A noisy 50x60 JPEG of about 2 KB, like a user's small photo.
        let img = image::RgbImage::from_fn(50, 60, |x, y| {
            image::Rgb([(x * 37 % 251) as u8, (y * 53 % 241) as u8, ((x * y) % 255) as u8])
        });
        let mut jpeg = Vec::new();
        DynamicImage::ImageRgb8(img).write_to(&mut Cursor::new(&mut jpeg), ImageFormat::Jpeg).unwrap();
        assert!(jpeg.len() < 4096 && jpeg.ends_with(&[0xFF, 0xD9]), "{} bytes", jpeg.len());
        let opts = LoadOptions::default();
        let whole = decode_image(&jpeg, &opts).unwrap();
        let no_eoi = decode_image(&jpeg[..jpeg.len() - 2], &opts).unwrap();
        assert_eq!(whole.as_raw(), no_eoi.as_raw(), "only the end marker missing");
        let scan_start = jpeg.windows(2).position(|m| m == [0xFF, 0xDA]).unwrap();
        // Scans cut to under 256 bytes (a 1.5 KB file cut to 500 bytes).
        for scan_bytes in [100, 200, 250] {
            let err = decode_image(&jpeg[..scan_start + scan_bytes], &opts).unwrap_err();
            assert!(matches!(err, ImageFault::TruncatedJpeg(_)), "{scan_bytes}: {err}");
        }
    }

    #[test]
    fn pixel_cap_is_checked_before_decoding() {
        let bytes = png_bytes(DynamicImage::ImageLuma8(image::GrayImage::new(100, 100)));
        let opts = LoadOptions { max_pixels: 9_999, ..Default::default() };
        let err = decode_image(&bytes, &opts).unwrap_err();
        assert_eq!(err, ImageFault::OverPixelCap { width: 100, height: 100, max_pixels: 9_999 });
        assert!(err.to_string().starts_with("100x100 is 0.0 megapixels, over the cap of 0.0"), "{err}");
    }
}
