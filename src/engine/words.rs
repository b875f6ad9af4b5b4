//! How messages say counts: `1 step`, `2 steps`, `3 classes`.

/// `n` and `noun`, plural unless `n` is 1 (`1 step`, `2 steps`, `3 classes`): for the
/// counts that messages print.
pub fn count(n: usize, noun: &str) -> String {
    match (n, noun.ends_with('s')) {
        (1, _) => format!("1 {noun}"),
        (_, true) => format!("{n} {noun}es"),
        _ => format!("{n} {noun}s"),
    }
}

#[cfg(test)]
mod tests {
    #[test]
    fn one_is_singular_and_nouns_in_s_take_es() {
        assert_eq!(super::count(1, "step"), "1 step");
        assert_eq!(super::count(0, "image"), "0 images");
        assert_eq!(super::count(3, "class"), "3 classes");
    }
}
