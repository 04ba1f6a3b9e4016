//! JSON written the way Python's `json.dumps(..., ensure_ascii=False)` writes it, which is
//! what chat templates' `tojson` produces under transformers.

use std::fmt::Write;

use serde_json::Value as Json;

/// Appends `value` to `out`. Without `indent`: `", "` and `": "` separators on one line. With
/// `indent`: one item per line, indented by `indent` spaces per level, `","` and `": "`.
pub(crate) fn write_python_json(
    out: &mut String,
    value: &Json,
    indent: Option<usize>,
    depth: usize,
) {
    match value {
        Json::Null => out.push_str("null"),
        Json::Bool(b) => out.push_str(if *b { "true" } else { "false" }),
        Json::Number(n) => match (n.as_i64(), n.as_u64(), n.as_f64()) {
            (Some(i), _, _) => {
                let _ = write!(out, "{i}");
            }
            (None, Some(u), _) => {
                let _ = write!(out, "{u}");
            }
            (None, None, Some(f)) => out.push_str(&python_float_repr(f)),
            (None, None, None) => out.push_str(&n.to_string()),
        },
        Json::String(s) => write_string(out, s),
        Json::Array(items) => {
            if items.is_empty() {
                out.push_str("[]");
                return;
            }
            out.push('[');
            for (i, item) in items.iter().enumerate() {
                separator(out, i, indent, depth + 1);
                write_python_json(out, item, indent, depth + 1);
            }
            closing(out, indent, depth);
            out.push(']');
        }
        Json::Object(map) => {
            if map.is_empty() {
                out.push_str("{}");
                return;
            }
            out.push('{');
            for (i, (key, item)) in map.iter().enumerate() {
                separator(out, i, indent, depth + 1);
                write_string(out, key);
                out.push_str(": ");
                write_python_json(out, item, indent, depth + 1);
            }
            closing(out, indent, depth);
            out.push('}');
        }
    }
}

/// What goes before item `i` of a list or object at nesting `depth`.
fn separator(out: &mut String, i: usize, indent: Option<usize>, depth: usize) {
    match indent {
        None if i > 0 => out.push_str(", "),
        None => {}
        Some(width) => {
            if i > 0 {
                out.push(',');
            }
            out.push('\n');
            out.extend(std::iter::repeat_n(' ', width * depth));
        }
    }
}

/// What goes before the closing bracket of a non-empty list or object at `depth`.
fn closing(out: &mut String, indent: Option<usize>, depth: usize) {
    if let Some(width) = indent {
        out.push('\n');
        out.extend(std::iter::repeat_n(' ', width * depth));
    }
}

/// A JSON string literal escaping only what Python escapes with `ensure_ascii=False`.
fn write_string(out: &mut String, s: &str) {
    out.push('"');
    for c in s.chars() {
        match c {
            '"' => out.push_str("\\\""),
            '\\' => out.push_str("\\\\"),
            '\n' => out.push_str("\\n"),
            '\r' => out.push_str("\\r"),
            '\t' => out.push_str("\\t"),
            '\u{8}' => out.push_str("\\b"),
            '\u{c}' => out.push_str("\\f"),
            c if (c as u32) < 0x20 => {
                let _ = write!(out, "\\u{:04x}", c as u32);
            }
            c => out.push(c),
        }
    }
    out.push('"');
}

/// Python's `repr(float)`: the shortest round-tripping digits, positional for exponents in
/// [-4, 16), scientific (`1e+16`, `1.5e-05`) outside it, and `.0` on integral values.
fn python_float_repr(f: f64) -> String {
    if f.is_nan() {
        return "NaN".to_string();
    }
    if f.is_infinite() {
        return if f > 0.0 { "Infinity" } else { "-Infinity" }.to_string();
    }
    // `{:e}` gives the shortest round-tripping digits: "-1.5e20", "1e-5".
    let sci = format!("{f:e}");
    let (mantissa, exp) = sci.split_once('e').unwrap_or((sci.as_str(), "0"));
    let exp: i32 = exp.parse().unwrap_or(0);
    let (sign, mantissa) = match mantissa.strip_prefix('-') {
        Some(m) => ("-", m),
        None => ("", mantissa),
    };
    let digits: String = mantissa.chars().filter(|c| *c != '.').collect();
    if !(-4..16).contains(&exp) {
        let exp_sign = if exp < 0 { '-' } else { '+' };
        return format!("{sign}{mantissa}e{exp_sign}{:02}", exp.abs());
    }
    if exp < 0 {
        let zeros = "0".repeat((-exp - 1) as usize);
        return format!("{sign}0.{zeros}{digits}");
    }
    let int_len = exp as usize + 1;
    if digits.len() <= int_len {
        let zeros = "0".repeat(int_len - digits.len());
        format!("{sign}{digits}{zeros}.0")
    } else {
        format!("{sign}{}.{}", &digits[..int_len], &digits[int_len..])
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn dumps(value: &Json, indent: Option<usize>) -> String {
        let mut out = String::new();
        write_python_json(&mut out, value, indent, 0);
        out
    }

    #[test]
    fn floats_print_as_python_repr() {
        let cases = [
            (1.0, "1.0"),
            (0.5, "0.5"),
            (-2.25, "-2.25"),
            (1e16, "1e+16"),
            (1.5e20, "1.5e+20"),
            (1e15, "1000000000000000.0"),
            (0.0001, "0.0001"),
            (0.00001, "1e-05"),
            (123.456, "123.456"),
            (0.0, "0.0"),
        ];
        for (f, want) in cases {
            assert_eq!(python_float_repr(f), want, "repr({f})");
        }
    }

    #[test]
    fn separators_and_escapes_match_python() {
        let v: Json = serde_json::from_str(
            r#"{"b": [1, 2.5, "x\"y\n"], "a": {"é": null, "t": true}, "e": [], "o": {}}"#,
        )
        .unwrap();
        assert_eq!(
            dumps(&v, None),
            r#"{"b": [1, 2.5, "x\"y\n"], "a": {"é": null, "t": true}, "e": [], "o": {}}"#
        );
        assert_eq!(
            dumps(&v, Some(2)),
            "{\n  \"b\": [\n    1,\n    2.5,\n    \"x\\\"y\\n\"\n  ],\n  \"a\": {\n    \"é\": null,\n    \"t\": true\n  },\n  \"e\": [],\n  \"o\": {}\n}"
        );
        assert_eq!(
            dumps(&Json::String("\u{1}\u{7f}".into()), None),
            "\"\\u0001\u{7f}\""
        );
    }
}
