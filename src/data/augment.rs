//! Training-time augmentation on one image tensor (`[3, H, W]`, values 0..1 before normalization,
//! except random erasing, which runs on the normalized tensor so the erased area reads as the mean).

use rand::Rng;

use crate::config::AugmentConfig;

/// Flips a `[3, H, W]` image horizontally in place.
pub fn hflip(chw: &mut [f32], h: usize, w: usize) {
    for plane in chw.chunks_mut(h * w) {
        for row in plane.chunks_mut(w) {
            row.reverse();
        }
    }
}

/// Brightness, contrast and saturation factors of [`color_jitter`], each uniform in
/// `[1 - s, 1 + s]` (`None` when `strength` is 0: nothing is drawn).
pub fn draw_jitter(strength: f32, rng: &mut impl Rng) -> Option<[f32; 3]> {
    if strength <= 0.0 {
        return None;
    }
    let mut factor = || rng.random_range((1.0 - strength).max(0.0)..=1.0 + strength);
    Some([factor(), factor(), factor()])
}

/// Brightness, contrast and saturation jitter, each factor uniform in `[1 - s, 1 + s]`
/// (torchvision `ColorJitter` semantics), on a `[3, H, W]` image in 0..1.
pub fn color_jitter(chw: &mut [f32], h: usize, w: usize, strength: f32, rng: &mut impl Rng) {
    if let Some(factors) = draw_jitter(strength, rng) {
        apply_jitter(chw, h, w, factors);
    }
}

/// [`color_jitter`] with drawn `[brightness, contrast, saturation]` factors: brightness scales
/// and clamps; contrast blends with the mean grey (ITU-R 601 luma) of the brightened image;
/// saturation blends each pixel with its own grey; every stage clamps to 0..1.
pub fn apply_jitter(chw: &mut [f32], h: usize, w: usize, [b, c, s]: [f32; 3]) {
    let n = h * w;
    let gray = |chw: &[f32], i: usize| 0.299 * chw[i] + 0.587 * chw[n + i] + 0.114 * chw[2 * n + i];
    for v in chw.iter_mut() {
        *v = (*v * b).clamp(0.0, 1.0);
    }
    let mean_gray = (0..n).map(|i| gray(chw, i)).sum::<f32>() / n as f32;
    for v in chw.iter_mut() {
        *v = ((*v - mean_gray) * c + mean_gray).clamp(0.0, 1.0);
    }
    for i in 0..n {
        let g = gray(chw, i);
        for ch in 0..3 {
            let v = &mut chw[ch * n + i];
            *v = ((*v - g) * s + g).clamp(0.0, 1.0);
        }
    }
}

/// A rectangle of an `h x w` image: top-left `(y0, x0)`, height and width in pixels.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct EraseRect {
    /// First row.
    pub y0: usize,
    /// First column.
    pub x0: usize,
    /// Rows.
    pub height: usize,
    /// Columns.
    pub width: usize,
}

/// The rectangle [`random_erasing`] erases (Zhong et al. 2017): with probability `p`, one of
/// 2-33% of the area and aspect 0.3-3.3, from up to 10 tries (`None`: nothing erased).
pub fn draw_erasing(h: usize, w: usize, p: f32, rng: &mut impl Rng) -> Option<EraseRect> {
    if p <= 0.0 || rng.random::<f32>() >= p {
        return None;
    }
    for _ in 0..10 {
        let area = rng.random_range(0.02..0.33) * (h * w) as f32;
        let aspect = (rng.random_range(0.3f32.ln()..3.3f32.ln())).exp();
        let eh = (area * aspect).sqrt().round() as usize;
        let ew = (area / aspect).sqrt().round() as usize;
        if eh == 0 || ew == 0 || eh >= h || ew >= w {
            continue;
        }
        let y0 = rng.random_range(0..=h - eh);
        let x0 = rng.random_range(0..=w - ew);
        return Some(EraseRect { y0, x0, height: eh, width: ew });
    }
    None
}

/// Random erasing: the rectangle of [`draw_erasing`] set to 0 (the mean, on a normalized image).
pub fn random_erasing(chw: &mut [f32], h: usize, w: usize, p: f32, rng: &mut impl Rng) {
    if let Some(r) = draw_erasing(h, w, p, rng) {
        for plane in chw.chunks_mut(h * w) {
            for y in r.y0..r.y0 + r.height {
                plane[y * w + r.x0..y * w + r.x0 + r.width].fill(0.0);
            }
        }
    }
}

/// Whether [`before_normalize`] flips: a coin when `cfg.hflip` (nothing drawn otherwise).
pub fn draw_flip(cfg: &AugmentConfig, rng: &mut impl Rng) -> bool {
    cfg.hflip && rng.random::<bool>()
}

/// The pixel-level augmentations before normalization (flip, jitter), as configured.
pub fn before_normalize(chw: &mut [f32], h: usize, w: usize, cfg: &AugmentConfig, rng: &mut impl Rng) {
    if draw_flip(cfg, rng) {
        hflip(chw, h, w);
    }
    color_jitter(chw, h, w, cfg.color_jitter, rng);
}

#[cfg(test)]
mod tests {
    use super::*;
    use rand::SeedableRng;

    #[test]
    fn hflip_reverses_rows_of_each_channel() {
        let mut x: Vec<f32> = (0..12).map(|v| v as f32).collect();
        hflip(&mut x, 2, 2);
        assert_eq!(x, vec![1., 0., 3., 2., 5., 4., 7., 6., 9., 8., 11., 10.]);
    }

    #[test]
    fn erasing_zeroes_a_rectangle_when_it_fires() {
        let mut rng = rand::rngs::SmallRng::seed_from_u64(3);
        let mut x = vec![1.0f32; 3 * 32 * 32];
        random_erasing(&mut x, 32, 32, 1.0, &mut rng);
        let zeros = x.iter().filter(|v| **v == 0.0).count();
        assert!((3 * 20..=3 * 32 * 32 / 3 + 3 * 64).contains(&zeros), "erased {zeros}");
        assert_eq!(zeros % 3, 0);
    }

    #[test]
    fn jitter_keeps_values_in_range() {
        let mut rng = rand::rngs::SmallRng::seed_from_u64(5);
        let mut x: Vec<f32> = (0..3 * 16).map(|i| (i % 7) as f32 / 6.0).collect();
        color_jitter(&mut x, 4, 4, 0.8, &mut rng);
        assert!(x.iter().all(|v| (0.0..=1.0).contains(v)));
    }
}
