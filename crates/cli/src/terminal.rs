//! Model text shown on a terminal: a model can emit any bytes, and raw control characters
//! (ESC sequences, ^N/^O charset shifts, CR, BEL) would be interpreted by the terminal:
//! recolouring, moving the cursor, switching it to line-drawing glyphs, or overwriting text.

use std::borrow::Cow;

/// `text` with every control character but `\n` and `\t` replaced by a visible stand-in: C0
/// controls and DEL by their Unicode control pictures (ESC → `␛`, ^N → `␎`, CR → `␍`, DEL →
/// `␡`), C1 controls (U+0080-U+009F) by U+FFFD. Text without them is returned as is.
///
/// `spindle run` applies this only when stdout is a terminal; piped or redirected output
/// keeps the model's exact text.
pub fn printable(text: &str) -> Cow<'_, str> {
    let shown = |c: char| c == '\n' || c == '\t' || !c.is_control();
    if text.chars().all(shown) {
        return Cow::Borrowed(text);
    }
    Cow::Owned(
        text.chars()
            .map(|c| match c {
                c if shown(c) => c,
                '\u{7f}' => '\u{2421}',
                c if (c as u32) < 0x20 => char::from_u32(0x2400 + c as u32).unwrap_or('\u{fffd}'),
                _ => '\u{fffd}',
            })
            .collect(),
    )
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn control_characters_become_visible_except_newline_and_tab() {
        assert_eq!(printable("plain text\nline\ttab"), "plain text\nline\ttab");
        assert!(matches!(printable("héllo ✓"), Cow::Borrowed(_)));
        assert_eq!(
            printable("a\u{1b}[31mred\u{e}\u{f}\r\u{7}\u{7f}\u{9b}z"),
            "a\u{241b}[31mred\u{240e}\u{240f}\u{240d}\u{2407}\u{2421}\u{fffd}z"
        );
        assert_eq!(printable("\0"), "\u{2400}");
    }
}
