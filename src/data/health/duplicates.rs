//! Groups of copies among a dataset's images, and what each group means: copies inside one class
//! (harmless, but the picture weighs double), the same picture under two labels (a label
//! conflict: one label is wrong), and validation images that copy training images (leakage:
//! validation accuracy is inflated).
//!
//! Two images are linked when their bytes hash equal, their decoded pixels hash equal, or their
//! mean colours match and their perceptual hashes are at most `near_bits` apart (or one's is
//! that close to the other's mirror image's: [`super::hashes`], [`near_kind`]). A group is a connected set of links (so a chain of near copies is
//! one group), and its [`MatchKind`] is its loosest link. Exact links are found through a hash
//! map; near links by comparing every pair of perceptual hashes (one XOR and popcount each, on
//! all cores: about a second for 70,000 images on 2 cores), up to [`NEAR_SEARCH_MAX_IMAGES`].

use std::collections::{BTreeSet, HashMap};

use rayon::prelude::*;
use serde::Serialize;

use super::hashes::{ImageHashes, distance};
use crate::data::split_record::Split;

/// Above this many images only exact copies are searched (every pair of perceptual hashes is
/// 2 * 10^10 comparisons at this size, about a minute on 2 cores); the report says so.
pub const NEAR_SEARCH_MAX_IMAGES: usize = 200_000;

/// How the images of a group match, strictest first.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Serialize)]
#[serde(rename_all = "snake_case")]
pub enum MatchKind {
    /// The same bytes: the file copied.
    ByteIdentical,
    /// Different files, every decoded pixel the same (saved again, other metadata).
    PixelIdentical,
    /// The same picture resized, re-compressed or slightly cropped (perceptual hash).
    Near,
    /// The same picture mirrored left to right.
    Mirrored,
}

impl MatchKind {
    /// The kind in words, for reports.
    pub fn describe(self) -> &'static str {
        match self {
            MatchKind::ByteIdentical => "byte-identical",
            MatchKind::PixelIdentical => "pixel-identical",
            MatchKind::Near => "near copies",
            MatchKind::Mirrored => "mirrored copies",
        }
    }
}

/// One image of a group.
#[derive(Clone, Debug, PartialEq, Eq, PartialOrd, Ord, Serialize)]
pub struct Member {
    /// Its split.
    pub split: Split,
    /// Its path relative to the dataset folder (or `idx image #N`).
    pub path: String,
    /// Its class name.
    pub class: String,
    /// Its index in its split's dataset.
    pub index: usize,
}

/// Images that are copies of one picture.
#[derive(Clone, Debug, PartialEq, Serialize)]
pub struct DuplicateGroup {
    /// The loosest link in the group.
    pub kind: MatchKind,
    /// Its images: training images first, then by path.
    pub members: Vec<Member>,
}

impl DuplicateGroup {
    /// The classes its images are filed under.
    pub fn classes(&self) -> BTreeSet<&str> {
        self.members.iter().map(|m| m.class.as_str()).collect()
    }

    /// Its images in the order reports list them: the first of each class, then the rest (so
    /// a report naming only the first few names every label of a conflict).
    pub fn for_display(&self) -> Vec<&Member> {
        let mut seen = BTreeSet::new();
        let (firsts, rest): (Vec<&Member>, Vec<&Member>) =
            self.members.iter().partition(|m| seen.insert(m.class.as_str()));
        firsts.into_iter().chain(rest).collect()
    }

    /// The same picture under two or more labels.
    pub fn is_conflict(&self) -> bool {
        self.classes().len() > 1
    }

    /// Its validation images when it also holds a training image (else none).
    pub fn leaked(&self) -> Vec<&Member> {
        if !self.members.iter().any(|m| m.split == Split::Train) {
            return vec![];
        }
        self.members.iter().filter(|m| m.split == Split::Val).collect()
    }
}

/// Every group of copies in a dataset.
#[derive(Clone, Debug, Default, PartialEq, Serialize)]
pub struct Duplicates {
    /// The groups, in order of their first member.
    pub groups: Vec<DuplicateGroup>,
    /// Whether near copies were searched (false above [`NEAR_SEARCH_MAX_IMAGES`]).
    pub near_searched: bool,
    /// The perceptual-hash threshold used, bits of 64.
    pub near_bits: u32,
}

impl Duplicates {
    /// Groups inside one class and one split, or whose validation images copy no training image:
    /// copies that do no harm beyond weighing double (a group that leaks is [`Self::leaked`]'s).
    pub fn within_class(&self) -> impl Iterator<Item = &DuplicateGroup> {
        self.groups.iter().filter(|g| !g.is_conflict() && g.leaked().is_empty())
    }

    /// Groups whose images are filed under two or more classes.
    pub fn conflicts(&self) -> impl Iterator<Item = &DuplicateGroup> {
        self.groups.iter().filter(|g| g.is_conflict())
    }

    /// Validation images that copy a training image, with the group they are in.
    pub fn leaked(&self) -> Vec<(&Member, &DuplicateGroup)> {
        self.groups.iter().flat_map(|g| g.leaked().into_iter().map(move |m| (m, g))).collect()
    }

    /// Images that are a copy of an earlier one in their group (the count a user could delete).
    pub fn extra_copies(&self) -> usize {
        self.groups.iter().map(|g| g.members.len() - 1).sum()
    }
}

/// The groups among `images` (each with its hashes; `None`: not decodable, left out), linked as
/// the module docs say with perceptual hashes at most `near_bits` apart.
pub fn find(images: &[(Member, Option<ImageHashes>)], near_bits: u32) -> Duplicates {
    let mut sets = DisjointSets::new(images.len());
    for key in [|h: &ImageHashes| h.bytes, |h: &ImageHashes| h.pixels] {
        let mut first: HashMap<u128, usize> = HashMap::new();
        for (i, (_, h)) in images.iter().enumerate() {
            let Some(h) = h else { continue };
            match first.get(&key(h)) {
                Some(&j) => sets.link(
                    j,
                    i,
                    if h.bytes == images[j].1.map_or(0, |o| o.bytes) {
                        MatchKind::ByteIdentical
                    } else {
                        MatchKind::PixelIdentical
                    },
                ),
                None => {
                    first.insert(key(h), i);
                }
            }
        }
    }
    let near_searched = images.len() <= NEAR_SEARCH_MAX_IMAGES;
    if near_searched {
        link_near(images, near_bits, &mut sets);
    }
    Duplicates { groups: sets.groups(images), near_searched, near_bits }
}

/// Rows of the pair search the threads take at once: bounds the links held at once to `ROWS`
/// times the images (one picture copied 8,000 times made 32 million links at once, 1.6 GB,
/// when every pair was collected first).
const ROWS: usize = 256;

/// Links every pair of non-flat images whose perceptual hashes (or one's and the other's mirror
/// image's) are at most `near_bits` apart and whose mean colours match ([`colours_match`]), with
/// the kind of the link. One image per group of exact copies is compared (the others are
/// linked to it), and a pair already in one group is skipped.
fn link_near(images: &[(Member, Option<ImageHashes>)], near_bits: u32, sets: &mut DisjointSets) {
    let hashes: Vec<Option<ImageHashes>> = images.iter().map(|(_, h)| h.filter(|h| !h.flat)).collect();
    let reps: Vec<usize> = (0..images.len()).filter(|&i| hashes[i].is_some() && sets.root(i) == i).collect();
    for start in (0..reps.len()).step_by(ROWS) {
        let roots: Vec<usize> = reps.iter().map(|&i| sets.root(i)).collect();
        let links: Vec<(usize, usize, MatchKind)> = (start..(start + ROWS).min(reps.len()))
            .into_par_iter()
            .flat_map_iter(|a| {
                let (hashes, roots, reps) = (&hashes, &roots, &reps);
                (a + 1..reps.len()).filter_map(move |b| {
                    if roots[a] == roots[b] {
                        return None;
                    }
                    let (x, y) = (hashes[reps[a]].as_ref()?, hashes[reps[b]].as_ref()?);
                    let kind = near_kind(x, y, near_bits)?;
                    Some((reps[a], reps[b], kind))
                })
            })
            .collect();
        for (i, j, kind) in links {
            sets.link(i, j, kind);
        }
    }
}

/// How `x` and `y` match: [`MatchKind::Near`] (perceptual hashes at most `near_bits` apart),
/// [`MatchKind::Mirrored`] (one's and the other's mirror image's), or not at all; either way
/// only when their mean colours match.
pub fn near_kind(x: &ImageHashes, y: &ImageHashes, near_bits: u32) -> Option<MatchKind> {
    if !colours_match(x.colour, y.colour) {
        None
    } else if distance(&x.perceptual, &y.perceptual) <= near_bits {
        Some(MatchKind::Near)
    } else if distance(&x.perceptual, &y.mirrored).min(distance(&x.mirrored, &y.perceptual)) <= near_bits {
        Some(MatchKind::Mirrored)
    } else {
        None
    }
}

/// Mean colours this close (in each channel, of 255) may be one picture. The perceptual hash
/// sees grey only: without this a red and a green object of one shape (two traffic lights)
/// were "the same picture under two labels". Re-encoding and resizing move the mean by a few
/// levels.
pub const COLOUR_LEVELS: u8 = 24;

/// Whether two mean colours are within [`COLOUR_LEVELS`] in every channel.
pub fn colours_match(a: [u8; 3], b: [u8; 3]) -> bool {
    a.iter().zip(b).all(|(&x, y)| x.abs_diff(y) <= COLOUR_LEVELS)
}

/// Union-find over image indices, each set remembering its loosest link.
struct DisjointSets {
    parent: Vec<usize>,
    kind: Vec<Option<MatchKind>>,
}

impl DisjointSets {
    fn new(n: usize) -> Self {
        Self { parent: (0..n).collect(), kind: vec![None; n] }
    }

    fn root(&mut self, mut i: usize) -> usize {
        while self.parent[i] != i {
            self.parent[i] = self.parent[self.parent[i]];
            i = self.parent[i];
        }
        i
    }

    fn link(&mut self, a: usize, b: usize, kind: MatchKind) {
        let (ra, rb) = (self.root(a), self.root(b));
        if ra == rb {
            // Already one group through a stricter link (links are made strictest first).
            return;
        }
        let loosest = [self.kind[ra], self.kind[rb], Some(kind)].into_iter().flatten().max();
        let (keep, gone) = (ra.min(rb), ra.max(rb));
        self.parent[gone] = keep;
        self.kind[keep] = loosest;
    }

    /// The sets of two or more images, ordered by their first image.
    fn groups(mut self, images: &[(Member, Option<ImageHashes>)]) -> Vec<DuplicateGroup> {
        let mut by_root: std::collections::BTreeMap<usize, Vec<usize>> = Default::default();
        for i in 0..images.len() {
            let r = self.root(i);
            by_root.entry(r).or_default().push(i);
        }
        by_root
            .into_iter()
            .filter(|(_, members)| members.len() > 1)
            .map(|(root, members)| {
                let mut members: Vec<Member> = members.into_iter().map(|i| images[i].0.clone()).collect();
                members.sort();
                DuplicateGroup { kind: self.kind[root].unwrap_or(MatchKind::ByteIdentical), members }
            })
            .collect()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn member(split: Split, path: &str, class: &str) -> Member {
        Member { split, path: path.into(), class: class.into(), index: 0 }
    }

    fn hashes(bytes: u128, pixels: u128, perceptual: u64) -> Option<ImageHashes> {
        let spread = |w: u64| [w; super::super::hashes::WORDS];
        Some(ImageHashes {
            bytes,
            pixels,
            perceptual: spread(perceptual),
            mirrored: spread(perceptual.reverse_bits()),
            flat: false,
            colour: [100, 100, 100],
        })
    }

    #[test]
    fn groups_are_classified_by_class_and_split() {
        let far = 0x0F0F_0F0F_0F0F_0F0F_u64;
        let images = vec![
            (member(Split::Train, "cat/a.png", "cat"), hashes(1, 1, 0)),
            (member(Split::Train, "cat/a (1).png", "cat"), hashes(1, 1, 0)),
            (member(Split::Train, "cat/b.png", "cat"), hashes(2, 2, far)),
            (member(Split::Train, "dog/b.png", "dog"), hashes(3, 2, far)),
            (member(Split::Val, "cat/c.png", "cat"), hashes(4, 4, u64::MAX)),
            (member(Split::Train, "cat/c.jpg", "cat"), hashes(5, 5, u64::MAX ^ 0b111)),
            (member(Split::Train, "cat/d.png", "cat"), hashes(6, 6, 0xFFFF_0000_FFFF_0000)),
            (member(Split::Val, "cat/e.png", "cat"), None),
        ];
        let d = find(&images, 4 * super::super::hashes::WORDS as u32);
        assert_eq!(d.groups.len(), 3);
        assert_eq!(d.groups[0].kind, MatchKind::ByteIdentical);
        assert_eq!(d.groups[1].kind, MatchKind::PixelIdentical);
        assert!(d.groups[1].is_conflict());
        assert_eq!(d.conflicts().count(), 1);
        assert_eq!(d.within_class().count(), 1, "the leaking group is leakage's, not a copy inside a class");
        let leaked = d.leaked();
        assert_eq!(leaked.len(), 1);
        assert_eq!(leaked[0].0.path, "cat/c.png");
        assert_eq!(leaked[0].1.kind, MatchKind::Near);
        assert_eq!(d.extra_copies(), 3);
    }

    #[test]
    fn one_shape_in_two_colours_is_not_one_picture() {
        let mut red = hashes(1, 1, 0xF0F0).unwrap();
        red.colour = [200, 20, 20];
        let mut green = hashes(2, 2, 0xF0F0).unwrap();
        green.colour = [20, 200, 20];
        let mut darker_red = red;
        (darker_red.bytes, darker_red.pixels, darker_red.colour) = (3, 3, [180, 24, 18]);
        let images = vec![
            (member(Split::Train, "red/a.png", "red"), Some(red)),
            (member(Split::Train, "green/a.png", "green"), Some(green)),
            (member(Split::Train, "red/b.jpg", "red"), Some(darker_red)),
        ];
        let d = find(&images, 8);
        assert_eq!(d.groups.len(), 1);
        assert_eq!(d.groups[0].members.iter().map(|m| m.path.as_str()).collect::<Vec<_>>(), ["red/a.png", "red/b.jpg"]);
    }

    #[test]
    fn thousands_of_copies_of_one_picture_make_one_group() {
        let images: Vec<_> = (0..3000u128)
            .map(|i| (member(Split::Train, &format!("a/{i:05}.jpg"), "a"), hashes(i, i, 0xABCD ^ (i as u64 & 1))))
            .collect();
        let d = find(&images, 8);
        assert_eq!((d.groups.len(), d.groups[0].members.len(), d.groups[0].kind), (1, 3000, MatchKind::Near));
    }

    #[test]
    fn a_mirror_match_is_its_own_kind_and_flat_images_match_by_pixels_only() {
        let p = [0x1234_5678_9ABC_DEF0_u64; super::super::hashes::WORDS];
        let not_p = p.map(|w| !w);
        let flat = |bytes, pixels| {
            Some(ImageHashes { bytes, pixels, perceptual: [0; 4], mirrored: [0; 4], flat: true, colour: [9; 3] })
        };
        let images = vec![
            (
                member(Split::Train, "a/x.png", "a"),
                Some(ImageHashes { bytes: 1, pixels: 1, perceptual: p, mirrored: not_p, flat: false, colour: [0; 3] }),
            ),
            (
                member(Split::Train, "a/y.png", "a"),
                Some(ImageHashes { bytes: 2, pixels: 2, perceptual: not_p, mirrored: p, flat: false, colour: [0; 3] }),
            ),
            (member(Split::Train, "a/white.png", "a"), flat(3, 3)),
            (member(Split::Train, "a/black.png", "a"), flat(4, 4)),
        ];
        let d = find(&images, 2);
        assert_eq!(d.groups.len(), 1, "{d:?}");
        assert_eq!(d.groups[0].kind, MatchKind::Mirrored);
    }
}
