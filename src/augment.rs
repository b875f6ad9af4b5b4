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

/// Brightness, contrast and saturation jitter, each factor uniform in `[1 - s, 1 + s]`
/// (torchvision `ColorJitter` semantics), on a `[3, H, W]` image in 0..1.
pub fn color_jitter(chw: &mut [f32], h: usize, w: usize, strength: f32, rng: &mut impl Rng) {
    if strength <= 0.0 {
        return;
    }
    let mut factor = || rng.random_range((1.0 - strength).max(0.0)..=1.0 + strength);
    let (b, c, s) = (factor(), factor(), factor());
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

/// Random erasing (Zhong et al. 2017): with probability `p`, one rectangle of 2-33% of the area
/// and aspect 0.3-3.3 is set to 0 (the mean, on a normalized image).
pub fn random_erasing(chw: &mut [f32], h: usize, w: usize, p: f32, rng: &mut impl Rng) {
    if p <= 0.0 || rng.random::<f32>() >= p {
        return;
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
        for plane in chw.chunks_mut(h * w) {
            for y in y0..y0 + eh {
                plane[y * w + x0..y * w + x0 + ew].fill(0.0);
            }
        }
        return;
    }
}

/// The pixel-level augmentations before normalization (flip, jitter), as configured.
pub fn before_normalize(chw: &mut [f32], h: usize, w: usize, cfg: &AugmentConfig, rng: &mut impl Rng) {
    if cfg.hflip && rng.random::<bool>() {
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
