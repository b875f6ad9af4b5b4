//! Config text as people save it: the file's encoding (UTF-8 with or without a BOM, UTF-16 with
//! a BOM as Windows editors write it; anything else refused naming the byte and its line), and
//! "did you mean" for a key that does not exist, in files and in `--set`.

/// The text of a config file's `bytes`: UTF-8 (a BOM is dropped) or UTF-16 LE/BE with its BOM.
///
/// # Errors
/// A message naming the first byte that is not UTF-8, its line and column, and the fix
/// (Latin-1 / Windows-1252 files are the usual cause).
pub fn decode(bytes: &[u8]) -> Result<String, String> {
    let utf16 = |be: bool| {
        let units = bytes[2..]
            .chunks_exact(2)
            .map(|c| if be { u16::from_be_bytes([c[0], c[1]]) } else { u16::from_le_bytes([c[0], c[1]]) });
        char::decode_utf16(units)
            .collect::<Result<String, _>>()
            .map_err(|_| "the file starts like UTF-16 but holds unpaired surrogates: save it as UTF-8".to_string())
    };
    match bytes {
        [0xFF, 0xFE, ..] => return utf16(false),
        [0xFE, 0xFF, ..] => return utf16(true),
        _ => {}
    }
    let bytes = bytes.strip_prefix(&[0xEF, 0xBB, 0xBF]).unwrap_or(bytes);
    // UTF-16 (or UTF-32) text without a BOM: every other byte of ASCII text is 0, which no
    // config written as UTF-8 holds.
    if bytes.len() >= 4 && bytes.iter().filter(|&&b| b == 0).count() * 4 >= bytes.len() {
        return Err("the file looks like UTF-16 or UTF-32 without a byte-order mark (its bytes are every other one \
                    0): save it as UTF-8"
            .into());
    }
    match std::str::from_utf8(bytes) {
        Ok(text) => Ok(text.to_string()),
        Err(e) => {
            let at = e.valid_up_to();
            let before = &bytes[..at];
            let line = before.iter().filter(|&&b| b == b'\n').count() + 1;
            let column = at - before.iter().rposition(|&b| b == b'\n').map_or(0, |p| p + 1) + 1;
            Err(format!(
                "byte 0x{:02X} at line {line}, column {column} is not UTF-8 (the file looks like Latin-1 or \
                 Windows-1252): save it as UTF-8",
                bytes[at]
            ))
        }
    }
}

/// Names people use for a key, and the key: checked before spelling.
const ALIASES: [(&str, &str); 9] = [
    ("learning_rate", "lr"),
    ("epoch", "epochs"),
    ("batch", "batch_size"),
    ("batchsize", "batch_size"),
    ("accumulation_steps", "grad_accum_steps"),
    ("gradient_accumulation_steps", "grad_accum_steps"),
    ("budget", "memory_budget_bytes"),
    ("image_size", "crop_size"),
    ("wd", "weight_decay"),
];

/// The key among `candidates` that `unknown` most likely meant: a known alias, the same key in
/// another case, or the closest spelling (Jaro-Winkler similarity of at least 0.8, from
/// `strsim`); `None` when none is close.
pub fn did_you_mean<'a>(unknown: &str, candidates: &[&'a str]) -> Option<&'a str> {
    let lower = unknown.to_ascii_lowercase();
    if let Some((_, key)) = ALIASES.iter().find(|(alias, _)| *alias == lower) {
        return candidates.iter().copied().find(|c| c == key);
    }
    let scored = candidates.iter().map(|c| (strsim::jaro_winkler(&lower, &c.to_ascii_lowercase()), *c));
    scored.filter(|(score, _)| *score >= 0.8).max_by(|a, b| a.0.total_cmp(&b.0)).map(|(_, c)| c)
}

/// `message` (a TOML error) with "did you mean `KEY`?" added when it reports an unknown field
/// and one of the fields it expected is close (serde's "unknown field `x`, expected one of `a`,
/// `b`" or "expected `a` or `b`").
pub fn with_suggestion(message: &str) -> String {
    let Some(rest) = message.split("unknown field `").nth(1) else { return message.to_string() };
    let Some((unknown, expected)) = rest.split_once('`') else { return message.to_string() };
    let candidates: Vec<&str> = expected.split('`').skip(1).step_by(2).collect();
    match did_you_mean(unknown, &candidates) {
        Some(key) => format!("{message}; did you mean `{key}`?"),
        None => message.to_string(),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn utf16_and_boms_decode_and_latin1_is_named_by_byte_and_line() {
        let text = "[train]\nepochs = 3\n";
        let mut le = vec![0xFF, 0xFE];
        le.extend(text.encode_utf16().flat_map(u16::to_le_bytes));
        let mut be = vec![0xFE, 0xFF];
        be.extend(text.encode_utf16().flat_map(u16::to_be_bytes));
        let bom = [&[0xEF, 0xBB, 0xBF][..], text.as_bytes()].concat();
        for bytes in [le, be, bom] {
            assert_eq!(decode(&bytes).unwrap(), text);
        }
        let e = decode(b"# caf\xe9\nname = \"x\"\n").unwrap_err();
        assert!(e.starts_with("byte 0xE9 at line 1, column 6 is not UTF-8") && e.contains("save it as UTF-8"), "{e}");
        assert!(decode(b"a = 1\n\nb = \"\xff\"").unwrap_err().contains("line 3, column 6"));
        let no_bom: Vec<u8> = text.encode_utf16().flat_map(u16::to_le_bytes).collect();
        assert!(decode(&no_bom).unwrap_err().contains("UTF-16 or UTF-32 without a byte-order mark"));
    }

    #[test]
    fn typos_aliases_and_case_get_a_suggestion_and_nonsense_gets_none() {
        let train = ["epochs", "batch_size", "grad_accum_steps", "precision"];
        assert_eq!(did_you_mean("epoch", &train), Some("epochs"));
        assert_eq!(did_you_mean("Batch_Size", &train), Some("batch_size"));
        assert_eq!(did_you_mean("bacth_size", &train), Some("batch_size"));
        assert_eq!(did_you_mean("learning_rate", &["lr", "weight_decay"]), Some("lr"));
        assert_eq!(did_you_mean("trian", &["model", "data", "train", "optimizer"]), Some("train"));
        assert_eq!(did_you_mean("colour_jitter_strength", &train), None);
        let m = with_suggestion("unknown field `learning_rate`, expected one of `lr`, `weight_decay`");
        assert!(m.ends_with("did you mean `lr`?"), "{m}");
        assert_eq!(with_suggestion("expected a table"), "expected a table");
    }
}
