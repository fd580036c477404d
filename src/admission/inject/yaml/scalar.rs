//! Plain scalars as go-yaml v2 (kubectl) reads them: YAML 1.1's integers
//! (octal `0644`, `0x1F`), booleans (`yes`, `off`), floats and nulls, and Go's
//! number parsing rules.

use super::*;

/// A float key as sigs.k8s.io/yaml writes it: Go's `FormatFloat(f, 'g', -1, 32)`.
pub(super) fn go_float_key(f: f64) -> String {
    let f = f as f32;
    let sci = format!("{f:e}");
    let (mantissa, exp) = sci.split_once('e').unwrap_or((&sci, "0"));
    let exp: i32 = exp.parse().unwrap_or(0);
    if (-4..6).contains(&exp) {
        format!("{f}")
    } else {
        format!("{mantissa}e{}{:02}", if exp < 0 { '-' } else { '+' }, exp.abs())
    }
}

/// What go-yaml v2 makes of a scalar.
#[derive(Debug, Clone, Copy, PartialEq)]
pub(super) enum Resolved {
    Null,
    Bool(bool),
    Int(i64),
    Uint(u64),
    Float(f64),
    Str,
}

pub(super) fn scalar_value(text: &str, style: ScalarStyle, tag: Option<&Tag>) -> Result<Value, YamlError> {
    let resolved = match tag {
        // Only plain scalars are resolved; quoted and block ones are strings.
        None if style == ScalarStyle::Plain => resolve(text),
        None => Resolved::Str,
        Some(tag) => {
            let full = full_tag(tag);
            match full.strip_prefix(CORE) {
                Some(kind @ ("null" | "bool" | "int" | "float")) => {
                    let r = resolve(text);
                    match (kind, r) {
                        ("null", Resolved::Null) | ("bool", Resolved::Bool(_)) => r,
                        ("int", Resolved::Int(_) | Resolved::Uint(_)) | ("float", Resolved::Float(_)) => r,
                        ("float", Resolved::Int(i)) => Resolved::Float(i as f64),
                        _ => return Err(YamlError::Invalid(format!("cannot read {text:?} as !!{kind}"))),
                    }
                }
                // !!str, !!timestamp (a string in go-yaml v2), !!binary, and any other tag: the text.
                _ => Resolved::Str,
            }
        }
    };
    Ok(match resolved {
        Resolved::Null => Value::Null,
        Resolved::Bool(b) => Value::Bool(b),
        Resolved::Int(i) => Value::Number(i.into()),
        Resolved::Uint(u) => Value::Number(u.into()),
        Resolved::Float(f) => Number::from_f64(f).map_or_else(|| Value::String(text.into()), Value::Number),
        Resolved::Str => Value::String(text.into()),
    })
}

/// go-yaml v2's `resolve` for an untagged plain scalar (YAML 1.1: `yes`/`on`
/// booleans, `0644` octal, `0x1F`, `1_000`, `08` a float; timestamps stay strings).
pub(super) fn resolve(text: &str) -> Resolved {
    use Resolved::*;
    match text {
        "y" | "Y" | "yes" | "Yes" | "YES" | "true" | "True" | "TRUE" | "on" | "On" | "ON" => return Bool(true),
        "n" | "N" | "no" | "No" | "NO" | "false" | "False" | "FALSE" | "off" | "Off" | "OFF" => return Bool(false),
        "" | "~" | "null" | "Null" | "NULL" => return Null,
        ".nan" | ".NaN" | ".NAN" => return Float(f64::NAN),
        ".inf" | ".Inf" | ".INF" | "+.inf" | "+.Inf" | "+.INF" => return Float(f64::INFINITY),
        "-.inf" | "-.Inf" | "-.INF" => return Float(f64::NEG_INFINITY),
        _ => {}
    }
    match text.as_bytes()[0] {
        b'.' => match yaml_style_float(text).then(|| go_parse_float(text)).flatten() {
            Some(f) => Float(f),
            None => Str,
        },
        b'0'..=b'9' | b'+' | b'-' => {
            let plain = text.replace('_', "");
            if let Some(i) = go_parse_int(&plain) {
                Int(i)
            } else if let Some(u) = go_parse_uint(&plain) {
                Uint(u)
            } else if let Some(f) = yaml_style_float(&plain).then(|| go_parse_float(&plain)).flatten() {
                Float(f)
            } else if let Some(bits) = plain.strip_prefix("-0b") {
                i64::from_str_radix(&format!("-{bits}"), 2).ok().filter(|_| is_digits(bits, 2)).map_or(Str, Int)
            } else {
                Str
            }
        }
        _ => Str,
    }
}

pub(super) fn is_digits(s: &str, radix: u32) -> bool {
    !s.is_empty() && s.chars().all(|c| c.is_digit(radix))
}

/// Go's `strconv.ParseUint(s, 0, 64)`: `0x`, `0o`, `0b` or a leading `0` (octal) prefix, no sign.
pub(super) fn go_parse_uint(s: &str) -> Option<u64> {
    let b = s.as_bytes();
    let (radix, digits) = match b {
        [b'0', b'x' | b'X', ..] => (16, &s[2..]),
        [b'0', b'o' | b'O', ..] => (8, &s[2..]),
        [b'0', b'b' | b'B', ..] => (2, &s[2..]),
        [b'0', _, ..] => (8, &s[1..]),
        _ => (10, s),
    };
    if !is_digits(digits, radix) {
        return None;
    }
    u64::from_str_radix(digits, radix).ok()
}

/// Go's `strconv.ParseInt(s, 0, 64)`: an optional sign, then as [`go_parse_uint`].
pub(super) fn go_parse_int(s: &str) -> Option<i64> {
    let (negative, body) = match s.as_bytes().first()? {
        b'+' => (false, &s[1..]),
        b'-' => (true, &s[1..]),
        _ => (false, s),
    };
    let magnitude = go_parse_uint(body)?;
    if negative {
        if magnitude == 1 << 63 { Some(i64::MIN) } else { i64::try_from(magnitude).ok().map(|m| -m) }
    } else {
        i64::try_from(magnitude).ok()
    }
}

/// `^[-+]?(\.[0-9]+|[0-9]+(\.[0-9]*)?)([eE][-+]?[0-9]+)?$`, go-yaml v2's float pattern.
pub(super) fn yaml_style_float(s: &str) -> bool {
    let s = s.strip_prefix(['+', '-']).unwrap_or(s);
    let (number, exponent) = match s.find(['e', 'E']) {
        Some(i) => (&s[..i], Some(&s[i + 1..])),
        None => (s, None),
    };
    let number_ok = match number.split_once('.') {
        Some(("", frac)) => is_digits(frac, 10),
        Some((int, frac)) => is_digits(int, 10) && (frac.is_empty() || is_digits(frac, 10)),
        None => is_digits(number, 10),
    };
    let exponent_ok = exponent.is_none_or(|e| is_digits(e.strip_prefix(['+', '-']).unwrap_or(e), 10));
    number_ok && exponent_ok
}

/// Go's `strconv.ParseFloat` for text matching [`yaml_style_float`]: out of
/// range is an error there, not an infinity.
pub(super) fn go_parse_float(s: &str) -> Option<f64> {
    s.parse::<f64>().ok().filter(|f| f.is_finite())
}
