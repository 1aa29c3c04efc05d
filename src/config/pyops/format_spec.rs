//! Python's format-spec mini-language for f-string fields (`f'{x:.2f}'`,
//! `f'{i:03d}'`): fill, alignment, sign, zero padding, width, precision and
//! the `d`, `f`/`F`, `e`, `s` and `%` types; anything else is refused rather
//! than formatted differently from Python.

use super::PyError;
use crate::config::value::{python_float_repr, python_str, Value};

/// Formats `v` by a format spec (`f'{x:.2f}'`, `f'{i:03d}'`).
pub fn format_value(v: &Value, spec: &str) -> Result<String, PyError> {
    if spec.is_empty() {
        return Ok(python_str(v));
    }
    let unsupported =
        || PyError::value_error(format!("format spec '{spec}' is not supported by segtune"));
    let re_spec = parse_spec(spec).ok_or_else(unsupported)?;
    let body = match (re_spec.kind, v) {
        (None | Some('s'), Value::Str(s)) => s.clone(),
        (None | Some('d'), Value::Int(i)) => i.abs().to_string(),
        (None, Value::Float(f)) if re_spec.precision.is_none() => python_float_repr(f.abs()),
        (Some('f' | 'F') | None, n) if n.as_f64().is_some() => {
            format!(
                "{:.*}",
                re_spec.precision.unwrap_or(6),
                n.as_f64().unwrap_or(0.0).abs()
            )
        }
        (Some('e'), n) if n.as_f64().is_some() => {
            let s = format!(
                "{:.*e}",
                re_spec.precision.unwrap_or(6),
                n.as_f64().unwrap_or(0.0).abs()
            );
            let (m, e) = s.split_once('e').unwrap_or((&s, "0"));
            let e: i32 = e.parse().unwrap_or(0);
            format!("{m}e{}{:02}", if e < 0 { '-' } else { '+' }, e.abs())
        }
        (Some('%'), n) if n.as_f64().is_some() => {
            format!(
                "{:.*}%",
                re_spec.precision.unwrap_or(6),
                n.as_f64().unwrap_or(0.0).abs() * 100.0
            )
        }
        _ => return Err(unsupported()),
    };
    let negative = v.as_f64().is_some_and(|x| x < 0.0) && !matches!(v, Value::Str(_));
    let sign = if negative {
        "-"
    } else if re_spec.sign == Some('+') && v.as_f64().is_some() {
        "+"
    } else {
        ""
    };
    let len = sign.len() + body.chars().count();
    let pad = re_spec.width.saturating_sub(len);
    Ok(if re_spec.zero_pad {
        format!("{sign}{}{body}", "0".repeat(pad))
    } else {
        let text = format!("{sign}{body}");
        let fill = re_spec.fill.to_string();
        let default_right = !matches!(v, Value::Str(_));
        match re_spec
            .align
            .unwrap_or(if default_right { '>' } else { '<' })
        {
            '<' => format!("{text}{}", fill.repeat(pad)),
            '^' => format!(
                "{}{text}{}",
                fill.repeat(pad / 2),
                fill.repeat(pad - pad / 2)
            ),
            _ => format!("{}{text}", fill.repeat(pad)),
        }
    })
}

/// `[[fill]align][sign][0][width][.precision][type]`, parsed.
struct FormatSpec {
    fill: char,
    align: Option<char>,
    sign: Option<char>,
    zero_pad: bool,
    width: usize,
    precision: Option<usize>,
    kind: Option<char>,
}

fn parse_spec(spec: &str) -> Option<FormatSpec> {
    let chars: Vec<char> = spec.chars().collect();
    let mut i = 0;
    let mut out = FormatSpec {
        fill: ' ',
        align: None,
        sign: None,
        zero_pad: false,
        width: 0,
        precision: None,
        kind: None,
    };
    if chars.len() >= 2 && matches!(chars[1], '<' | '>' | '^') {
        out.fill = chars[0];
        out.align = Some(chars[1]);
        i = 2;
    } else if chars.first().is_some_and(|c| matches!(c, '<' | '>' | '^')) {
        out.align = Some(chars[0]);
        i = 1;
    }
    if chars.get(i).is_some_and(|c| matches!(c, '+' | '-' | ' ')) {
        out.sign = Some(chars[i]);
        i += 1;
    }
    if chars.get(i) == Some(&'0') {
        out.zero_pad = true;
        i += 1;
    }
    let start = i;
    while chars.get(i).is_some_and(char::is_ascii_digit) {
        i += 1;
    }
    if i > start {
        out.width = chars[start..i].iter().collect::<String>().parse().ok()?;
    }
    if chars.get(i) == Some(&'.') {
        i += 1;
        let start = i;
        while chars.get(i).is_some_and(char::is_ascii_digit) {
            i += 1;
        }
        out.precision = Some(chars[start..i].iter().collect::<String>().parse().ok()?);
    }
    if let Some(c) = chars.get(i) {
        if !matches!(c, 'd' | 'f' | 'F' | 'e' | 's' | '%') {
            return None;
        }
        out.kind = Some(*c);
        i += 1;
    }
    (i == chars.len()).then_some(out)
}

#[cfg(test)]
mod tests {
    use super::*;
    use Value::{Float as F, Int as I};

    #[test]
    fn format_specs() {
        assert_eq!(format_value(&I(3), "03d").unwrap(), "003");
        assert_eq!(format_value(&F(0.5), ".2f").unwrap(), "0.50");
        assert_eq!(format_value(&F(1e-6), "").unwrap(), "1e-06");
        assert_eq!(
            format_value(&Value::Str("ab".into()), ">4").unwrap(),
            "  ab"
        );
        assert_eq!(format_value(&F(12345.0), ".2e").unwrap(), "1.23e+04");
    }
}
