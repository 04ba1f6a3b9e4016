//! A bound on the code of one template tag. minijinja's parser guards the nesting of blocks
//! and brackets, but a chain of unary operators (`- - - 1`, `not not x`) recurses once per
//! operator, and its compiler recurses once per level of any expression (`1 + 1 + ...`,
//! `x.a.a...`, `x|f|f...`): a template a few kilobytes long could overflow the stack and abort
//! the process. The depth of an expression is at most the number of bytes of code in its tag
//! (string literals excluded), so a tag holding more than [`MAX_TAG_CODE_BYTES`] is refused,
//! and templates are parsed on a thread whose stack holds that depth many times over.

/// Bytes of code (outside string literals) one `{{ }}` or `{% %}` tag may hold; the longest
/// tag of the Qwen3.6 template holds under a kilobyte.
pub const MAX_TAG_CODE_BYTES: usize = 64 << 10;

/// The stack of the thread that parses templates: a few hundred bytes per level of an
/// expression [`MAX_TAG_CODE_BYTES`] deep, several times over.
pub const PARSE_STACK_BYTES: usize = 64 << 20;

/// Where the first tag holding more than `limit` bytes of code starts, and how many it holds.
pub fn oversized_tag(source: &str, limit: usize) -> Option<(usize, usize)> {
    let b = source.as_bytes();
    let mut at = 0;
    while let Some(open) = find(b, at, |w| matches!(w, b"{{" | b"{%" | b"{#")) {
        let kind = b[open + 1];
        if kind == b'#' {
            at = find(b, open + 2, |w| w == b"#}").map_or(b.len(), |c| c + 2);
            continue;
        }
        let close: &[u8] = if kind == b'{' { b"}}" } else { b"%}" };
        let (mut i, mut code) = (open + 2, 0);
        while i < b.len() && !b[i..].starts_with(close) {
            match b[i] {
                quote @ (b'\'' | b'"') => {
                    i += 1;
                    while i < b.len() && b[i] != quote {
                        i += if b[i] == b'\\' { 2 } else { 1 };
                    }
                    i += 1;
                }
                _ => {
                    code += 1;
                    i += 1;
                }
            }
        }
        if code > limit {
            return Some((open, code));
        }
        at = (i + 2).min(b.len());
        // A raw block's text is not code.
        let tag = source.get(open + 2..i.min(b.len())).unwrap_or("");
        if kind == b'%'
            && tag.trim_matches(|c: char| c == '-' || c == '+' || c.is_whitespace()) == "raw"
        {
            at = source[at..]
                .find("endraw")
                .map_or(b.len(), |e| at + e + "endraw".len());
        }
    }
    None
}

fn find(b: &[u8], from: usize, hit: impl Fn(&[u8]) -> bool) -> Option<usize> {
    (from..b.len().saturating_sub(1)).find(|&i| hit(&b[i..i + 2]))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn code_is_counted_outside_strings_comments_and_raw_blocks() {
        assert_eq!(oversized_tag("{{ - - - 1 }}", 100), None);
        assert_eq!(oversized_tag("{{ - - - 1 }}", 5), Some((0, 9)));
        // String literals, even holding a closing delimiter, are not code.
        let long = format!(
            "a{{{{ '{}}}}}' ~ \"{}\" }}}}",
            "x".repeat(500),
            "\\\"".repeat(300)
        );
        assert_eq!(oversized_tag(&long, 20), None);
        assert_eq!(
            oversized_tag(&format!("{{# {} #}}", "-".repeat(500)), 20),
            None
        );
        let raw = format!("{{% raw %}}{{{{ {} }}}}{{% endraw %}}", "-".repeat(500));
        assert_eq!(oversized_tag(&raw, 20), None);
        // A quote cannot hide what follows its string.
        let hidden = format!("{{{{ '}}}}' {}1 }}}}", "- ".repeat(300));
        assert_eq!(oversized_tag(&hidden, 100), Some((0, 604)));
        let statement = format!("text {{%- if {}x %}}", "not ".repeat(100));
        assert_eq!(oversized_tag(&statement, 100), Some((5, 407)));
    }
}
