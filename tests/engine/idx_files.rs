//! IDX (MNIST format) files (C17).

use super::*;

#[test]
fn c17_idx_variants() {
    let c17 = cases().join("C17");
    let pair = |d: &str| idx::find_split(&c17.join(d), "train").map(|(i, l)| idx::load_pair(&i, &l));
    let sums = [1020u64, 3920, 8460, 14400, 21500, 29520, 38220, 47360, 56700, 66000];
    for d in ["ok", "gzipped", "gzip_without_gz_extension", "dotted_names_7zip"] {
        let (imgs, labels) = pair(d).unwrap().unwrap_or_else(|e| panic!("{d}: {e}"));
        assert_eq!((imgs.count, imgs.rows, imgs.cols), (10, 28, 28), "{d}");
        assert_eq!(labels, (0..10).collect::<Vec<u8>>());
        let got: Vec<u64> = (0..10).map(|i| imgs.image(i).iter().map(|&v| v as u64).sum()).collect();
        assert_eq!(got, sums, "{d}");
    }
    let err = |d: &str| pair(d).unwrap().unwrap_err().to_string();
    assert!(err("wrong_magic").contains("expected 2051 got 2049 (a labels file?)"), "{}", err("wrong_magic"));
    assert!(
        err("truncated_payload").contains("expected 7840 payload bytes, found 7448"),
        "{}",
        err("truncated_payload")
    );
    assert!(err("count_mismatch").contains("10 images vs 9 labels"), "{}", err("count_mismatch"));
    assert!(err("empty_file").contains("too short for a header"), "{}", err("empty_file"));
    assert!(err("html_instead_of_gzip").contains("not IDX or gzip"), "{}", err("html_instead_of_gzip"));
    assert!(err("wrong_ndim").contains("images must be 3-D"), "{}", err("wrong_ndim"));
    assert!(err("little_endian_header").contains("little-endian"), "{}", err("little_endian_header"));
    // As a dataset folder: the same errors, naming the file.
    let opts = ScanOptions { val_fraction: 0.2, seed: 1, allow_empty_classes: false, csv_paths_outside: false };
    let e = dataset::open(&c17.join("wrong_magic"), &opts).unwrap_err().to_string();
    assert!(e.contains("train-images-idx3-ubyte"), "{e}");
    let ok = dataset::open(&c17.join("gzipped"), &opts).unwrap();
    assert_eq!(ok.train.samples.len() + ok.val.samples.len(), 10);
}
