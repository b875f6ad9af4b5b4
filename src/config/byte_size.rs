//! Byte sizes as people write them: `6GiB`, `6 GB`, `6144MiB`, `1.5GiB`, `8000000000`, the same
//! in a config file (`memory_budget_bytes = "6GiB"`), in `--set` and on the command line.

use serde::de::{self, Deserializer, Visitor};

/// What a size must look like, for errors.
pub const SIZE_FORMAT: &str =
    "bytes, or a number with a unit: \"6GiB\", \"512MiB\", \"8GB\" (KiB/MiB/GiB are powers of 1024, kB/MB/GB of 1000)";

/// `6GiB`, `512 MiB`, `8GB`, `1.5GiB`, `1000000` -> bytes (units any case, spaces around them
/// ignored; `k`, `m`, `g` alone are the decimal units). `None` for anything else, such as
/// `6,5GiB` or a negative number.
pub fn parse_bytes(s: &str) -> Option<u64> {
    let s = s.trim();
    let split = s.find(|c: char| !(c.is_ascii_digit() || c == '.')).unwrap_or(s.len());
    let (num, unit) = s.split_at(split);
    let v: f64 = num.parse().ok()?;
    let mult: f64 = match unit.trim().to_ascii_lowercase().as_str() {
        "" | "b" => 1.0,
        "k" | "kb" => 1e3,
        "kib" => 1024.0,
        "m" | "mb" => 1e6,
        "mib" => 1024.0 * 1024.0,
        "g" | "gb" => 1e9,
        "gib" => 1024.0 * 1024.0 * 1024.0,
        "tb" => 1e12,
        "tib" => 1024.0 * 1024.0 * 1024.0 * 1024.0,
        _ => return None,
    };
    Some((v * mult) as u64)
}

/// Why `s` is not a size, for an error: a decimal comma is pointed out.
pub fn not_a_size(s: &str) -> String {
    let comma = if s.contains(',') { " (write decimals with a dot: 6.5GiB)" } else { "" };
    format!("`{}` is not a size{comma}: write {SIZE_FORMAT}", s.trim())
}

/// Serde `deserialize_with` for a byte count: an integer, or a string [`parse_bytes`] reads.
///
/// # Errors
/// A negative number, a fraction of a byte count, or text that is not a size ([`not_a_size`]).
pub fn deserialize<'de, D: Deserializer<'de>>(d: D) -> Result<u64, D::Error> {
    struct Bytes;
    impl Visitor<'_> for Bytes {
        type Value = u64;
        fn expecting(&self, f: &mut std::fmt::Formatter) -> std::fmt::Result {
            f.write_str(SIZE_FORMAT)
        }
        fn visit_u64<E: de::Error>(self, v: u64) -> Result<u64, E> {
            Ok(v)
        }
        fn visit_i64<E: de::Error>(self, v: i64) -> Result<u64, E> {
            u64::try_from(v).map_err(|_| E::custom(format!("{v} is negative: write {SIZE_FORMAT}")))
        }
        fn visit_f64<E: de::Error>(self, v: f64) -> Result<u64, E> {
            // `6e9` and `6.0` are whole numbers written as floats.
            if v >= 0.0 && v.fract() == 0.0 && v < u64::MAX as f64 {
                return Ok(v as u64);
            }
            Err(E::custom(format!("{v} bytes is not a whole, non-negative number: write {SIZE_FORMAT}")))
        }
        fn visit_str<E: de::Error>(self, v: &str) -> Result<u64, E> {
            parse_bytes(v).ok_or_else(|| E::custom(not_a_size(v)))
        }
    }
    d.deserialize_any(Bytes)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn sizes_parse_with_binary_and_decimal_units() {
        assert_eq!(parse_bytes("6GiB"), Some(6 << 30));
        assert_eq!(parse_bytes("6 GB"), Some(6_000_000_000));
        assert_eq!(parse_bytes("6144MiB"), Some(6 << 30));
        assert_eq!(parse_bytes(" 1.5GiB "), Some(3 << 29));
        assert_eq!(parse_bytes("512 mib"), Some(512 << 20));
        assert_eq!(parse_bytes("8000000000"), Some(8_000_000_000));
        for bad in ["6,5GiB", "-1GB", "6 GiB per card", "12x", ""] {
            assert_eq!(parse_bytes(bad), None, "{bad}");
        }
        assert!(not_a_size("6,5GiB").contains("decimals with a dot"));
    }
}
