//! Untrusted text (DESIGN §12.5): tool output written into a note has its bidi controls and
//! zero-width characters escaped as `\uXXXX`, so a result cannot disguise what it says.

/// Bidi embeddings, overrides and isolates (U+202A–U+202E, U+2066–U+2069), and zero-width
/// characters (U+200B–U+200D, U+2060, U+FEFF).
pub fn is_disguising(c: char) -> bool {
    matches!(
        c,
        '\u{202A}'..='\u{202E}'
            | '\u{2066}'..='\u{2069}'
            | '\u{200B}'..='\u{200D}'
            | '\u{2060}'
            | '\u{FEFF}'
    )
}

/// Replaces every disguising character with its `\uXXXX` escape (lower-case hex, as
/// `\u202e`). Inside a JSON string literal that escape means the same character, so JSON
/// text stays equal as a value; in plain text (a callout title) it shows what was there.
pub fn escape_untrusted(text: &str) -> String {
    if !text.chars().any(is_disguising) {
        return text.to_string();
    }
    let mut out = String::with_capacity(text.len() + 16);
    for c in text.chars() {
        if is_disguising(c) {
            out.push_str(&format!("\\u{:04x}", u32::from(c)));
        } else {
            out.push(c);
        }
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_listed_character_is_escaped() {
        for c in [
            '\u{202A}', '\u{202B}', '\u{202C}', '\u{202D}', '\u{202E}', '\u{2066}', '\u{2067}',
            '\u{2068}', '\u{2069}', '\u{200B}', '\u{200C}', '\u{200D}', '\u{2060}', '\u{FEFF}',
        ] {
            let out = escape_untrusted(&format!("a{c}b"));
            assert_eq!(out, format!("a\\u{:04x}b", u32::from(c)));
            assert!(!out.contains(c));
        }
    }

    #[test]
    fn other_text_is_untouched() {
        let s = "plain é 😀 \u{2028} \u{200E} `x`";
        assert_eq!(escape_untrusted(s), s);
    }

    #[test]
    fn escaped_json_is_the_same_value() {
        let v = serde_json::json!({ "t": "evil\u{202E}gnp.exe\u{200B}" });
        let text = escape_untrusted(&serde_json::to_string_pretty(&v).unwrap());
        assert!(text.contains("\\u202e"), "{text}");
        let back: serde_json::Value = serde_json::from_str(&text).unwrap();
        assert_eq!(back, v);
    }
}
