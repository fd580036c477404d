//! Validation of every name that becomes a path component.
//!
//! Nothing from an API object reaches the filesystem without passing one of these
//! checks, so no name can escape the tree (`..`, `/`, NUL) or collide with the
//! reserved `.`-prefixed metadata entries. Also the checks of the values a
//! user writes in flags and annotations: driver names and durations.

use std::time::Duration;

/// RFC 1123 label: pod claim names, request names.
pub fn is_dns_label(s: &str) -> bool {
    !s.is_empty()
        && s.len() <= 63
        && s.bytes().all(|b| b.is_ascii_lowercase() || b.is_ascii_digit() || b == b'-')
        && !s.starts_with('-')
        && !s.ends_with('-')
}

/// RFC 1123 subdomain: driver names, attribute domains, ResourceClaim names.
pub fn is_dns_subdomain(s: &str) -> bool {
    s.len() <= 253 && s.split('.').all(is_dns_label)
}

/// DRA attribute and capacity names: a C identifier of at most 64 characters.
pub fn is_c_identifier(s: &str) -> bool {
    let mut bytes = s.bytes();
    matches!(bytes.next(), Some(b) if b.is_ascii_alphabetic() || b == b'_')
        && s.len() <= 64
        && bytes.all(|b| b.is_ascii_alphanumeric() || b == b'_')
}

/// A member key of a driver's `status.devices[].data` that may become a file
/// name under `.status/data.d/`: 1 to 64 of `A-Z a-z 0-9 _ . -`, not starting
/// with `.` (drafs's own names, `..`) or `-` (read as a flag by shell tools).
pub fn is_data_key(s: &str) -> bool {
    let mut bytes = s.bytes();
    matches!(bytes.next(), Some(b) if b.is_ascii_alphanumeric() || b == b'_')
        && s.len() <= 64
        && bytes.all(|b| b.is_ascii_alphanumeric() || matches!(b, b'_' | b'.' | b'-'))
}

/// The first `max` characters of `text`, and whether that cut anything.
pub fn cut(text: &str, max: usize) -> (&str, bool) {
    match text.char_indices().nth(max) {
        Some((at, _)) => (&text[..at], true),
        None => (text, false),
    }
}

/// A name from an API object for a message: quoted and escaped (no control
/// character reaches a terminal or a log raw), and cut short if long.
pub fn quoted(name: &str) -> String {
    match cut(name, 64) {
        (head, true) => format!("{head:?}…"),
        (name, false) => format!("{name:?}"),
    }
}

/// A fully qualified attribute or capacity name: `domain/name`.
#[derive(Debug, Clone, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct QualifiedName {
    pub domain: String,
    pub name: String,
}

impl QualifiedName {
    /// Qualify a slice key: `domain/name` as is, a bare `name` in the driver's domain.
    pub fn parse(key: &str, driver: &str) -> Result<Self, String> {
        let (domain, name) = match key.split_once('/') {
            Some((domain, name)) => (domain, name),
            None => (driver, key),
        };
        if !is_dns_subdomain(domain) {
            return Err(format!("domain {domain:?} is not a DNS subdomain"));
        }
        if !is_c_identifier(name) {
            return Err(format!("name {name:?} is not a C identifier of at most 64 characters"));
        }
        Ok(Self { domain: domain.to_string(), name: name.to_string() })
    }
}

impl std::fmt::Display for QualifiedName {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "{}/{}", self.domain, self.name)
    }
}

/// The CSI driver name `drafs node` registers and the `csi` mode's volumes
/// name, unless told otherwise.
pub const DEFAULT_CSI_DRIVER: &str = "drafs.dev";

/// The container drafs adds to a pod (a pod with one has drafs already).
pub const DRAFS_CONTAINER: &str = "drafs";

/// A pod's options, as annotations: read by the webhook and `drafs inject`
/// for the container or volume they add, and by the node agent for the
/// mounts it adds through NRI.
pub const DIR_ANNOTATION: &str = "drafs.dev/dir";
pub const METADATA_DIR_ANNOTATION: &str = "drafs.dev/metadata-dir";
pub const METADATA_FROM_DRIVERS_ANNOTATION: &str = "drafs.dev/metadata-from-drivers";
pub const REQUIRE_ANNOTATION: &str = "drafs.dev/require";

/// Where the tree is mounted unless `drafs.dev/dir` says otherwise.
pub const DEFAULT_DIR: &str = "/dra";
/// Where readers of the standard (KEP-5304) view look.
pub const STANDARD_DIR: &str = "/var/run/kubernetes.io/dra-device-attributes";

/// A DRA driver name: a DNS subdomain, as the API requires.
pub fn parse_driver_name(text: &str) -> Result<String, String> {
    if is_dns_subdomain(text) {
        Ok(text.to_string())
    } else {
        Err(format!("{text:?} is not a driver name (a DNS subdomain such as gpu.example.com)"))
    }
}

/// The longest duration accepted (a deadline further out is a mistake, and
/// would overflow the clock).
pub const MAX_DURATION: Duration = Duration::from_secs(366 * 24 * 3600);

/// Parse `90s`, `5m`, `1h30m`, `250ms` or a bare number of seconds, at most [`MAX_DURATION`].
pub fn parse_duration(text: &str) -> Result<Duration, String> {
    let text = text.trim();
    let total = parse_duration_unbounded(text)?;
    if total > MAX_DURATION {
        return Err(format!("duration {text:?} is longer than the maximum of 366 days"));
    }
    Ok(total)
}

/// Parse a size in bytes as Kubernetes writes quantities of memory: `4Mi`,
/// `512Ki`, `1Gi`, or a bare number of bytes; at least 64 KiB, at most 1 GiB
/// (a volume of a tree of files).
pub fn parse_size(text: &str) -> Result<u64, String> {
    let text = text.trim();
    let digits = text.find(|c: char| !c.is_ascii_digit()).unwrap_or(text.len());
    let n: u64 = text[..digits].parse().map_err(|_| format!("invalid size {text:?}: expected e.g. 4Mi, 512Ki"))?;
    let unit: u64 = match &text[digits..] {
        "" => 1,
        "Ki" => 1 << 10,
        "Mi" => 1 << 20,
        "Gi" => 1 << 30,
        other => return Err(format!("invalid size {text:?}: unknown unit {other:?} (use Ki, Mi, Gi)")),
    };
    let bytes = n.checked_mul(unit).ok_or_else(|| format!("size {text:?} is too large"))?;
    if !(64 << 10..=1 << 30).contains(&bytes) {
        return Err(format!("size {text:?} must be between 64Ki and 1Gi"));
    }
    Ok(bytes)
}

/// A duration as the flags write it, in its largest whole unit (`2m`, `90s`,
/// `1500ms`): [`parse_duration`] reads it back exactly (to the millisecond).
pub fn duration_text(d: Duration) -> String {
    let ms = d.as_millis();
    match ms {
        0 => "0s".into(),
        ms if ms % 3_600_000 == 0 => format!("{}h", ms / 3_600_000),
        ms if ms % 60_000 == 0 => format!("{}m", ms / 60_000),
        ms if ms % 1000 == 0 => format!("{}s", ms / 1000),
        ms => format!("{ms}ms"),
    }
}

fn parse_duration_unbounded(text: &str) -> Result<Duration, String> {
    let too_long = || format!("duration {text:?} is longer than the maximum of 366 days");
    if let Ok(secs) = text.parse::<u64>() {
        return Ok(Duration::from_secs(secs));
    }
    let mut total = Duration::ZERO;
    let mut rest = text;
    while !rest.is_empty() {
        let digits = rest.find(|c: char| !c.is_ascii_digit()).unwrap_or(rest.len());
        if digits == 0 {
            return Err(format!("invalid duration {text:?}: expected e.g. 30s, 5m, 1h"));
        }
        let n: u64 = rest[..digits].parse().map_err(|_| format!("invalid duration {text:?}"))?;
        rest = &rest[digits..];
        let unit_len = rest.find(|c: char| c.is_ascii_digit()).unwrap_or(rest.len());
        let unit = match &rest[..unit_len] {
            "ms" => Duration::from_millis(n),
            "s" => Duration::from_secs(n),
            "m" => Duration::from_secs(n.checked_mul(60).ok_or_else(too_long)?),
            "h" => Duration::from_secs(n.checked_mul(3600).ok_or_else(too_long)?),
            other => return Err(format!("invalid duration {text:?}: unknown unit {other:?} (use ms, s, m, h)")),
        };
        total = total.checked_add(unit).ok_or_else(too_long)?;
        rest = &rest[unit_len..];
    }
    if text.is_empty() {
        return Err("empty duration".into());
    }
    Ok(total)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn duration_text_reads_back() {
        for (d, text) in [
            (Duration::ZERO, "0s"),
            (Duration::from_millis(250), "250ms"),
            (Duration::from_millis(1500), "1500ms"),
            (Duration::from_secs(90), "90s"),
            (Duration::from_secs(120), "2m"),
            (Duration::from_secs(7200), "2h"),
            (Duration::from_secs(5400), "90m"),
        ] {
            assert_eq!(duration_text(d), text);
            assert_eq!(parse_duration(text), Ok(d), "{text}");
        }
    }

    #[test]
    fn durations() {
        assert_eq!(parse_duration("90"), Ok(Duration::from_secs(90)));
        assert_eq!(parse_duration("5m"), Ok(Duration::from_secs(300)));
        assert_eq!(parse_duration("1h30m"), Ok(Duration::from_secs(5400)));
        assert_eq!(parse_duration("250ms"), Ok(Duration::from_millis(250)));
        assert!(parse_duration("5 minutes").is_err());
        assert!(parse_duration("").is_err());
        assert!(parse_duration("m").is_err());
        // Out of range: an error, never an overflow.
        assert!(parse_duration("18446744073709551615s").is_err());
        assert!(parse_duration("18446744073709551615").is_err());
        assert!(parse_duration("99999999999999999h").is_err());
        assert!(parse_duration("18446744073709551615s18446744073709551615s").is_err());
        assert!(parse_duration("367d").is_err());
        assert_eq!(parse_duration("8784h"), Ok(MAX_DURATION));
    }

    #[test]
    fn hostile_keys_are_rejected() {
        for key in
            ["../etc/passwd", "a/b/c", "/abs", "x/..", "", ".hidden", "d/.json", "d/a b", "d/a\0b", "UPPER.com/x"]
        {
            assert!(QualifiedName::parse(key, "gpu.example.com").is_err(), "{key:?} accepted");
        }
        let long = "a".repeat(65);
        assert!(QualifiedName::parse(&long, "gpu.example.com").is_err());
    }

    #[test]
    fn bare_keys_take_the_driver_domain() {
        let q = QualifiedName::parse("uuid", "gpu.nvidia.com").unwrap();
        assert_eq!(q.to_string(), "gpu.nvidia.com/uuid");
        let q = QualifiedName::parse("resource.kubernetes.io/pciBusID", "gpu.nvidia.com").unwrap();
        assert_eq!((q.domain.as_str(), q.name.as_str()), ("resource.kubernetes.io", "pciBusID"));
    }

    #[test]
    fn data_keys() {
        for good in ["uuid", "mig", "pciAddress", "parent_uuid", "1g.10gb", "_x", "a-b", "gpu0", "v1.2-rc.3", "a.."] {
            assert!(is_data_key(good), "{good:?} refused");
        }
        assert!(is_data_key(&"a".repeat(64)));
        for hostile in [
            "",
            "../x",
            "..",
            ".",
            "a/b",
            "/abs",
            ".ready",
            ".json",
            "-rf",
            "a b",
            "a\0b",
            "\0",
            "tab\t",
            "new\nline",
            "ü",
            "uuid\u{200b}",
            "ｕｕｉｄ",
            "a:b",
            "a\\b",
            "*",
            "$HOME",
        ] {
            assert!(!is_data_key(hostile), "{hostile:?} accepted");
        }
        assert!(!is_data_key(&"a".repeat(65)), "65 characters");
        assert!(!is_data_key(&"é".repeat(10)), "multi-byte characters");
    }

    #[test]
    fn labels_and_subdomains() {
        assert!(is_dns_label("gpu-0"));
        assert!(!is_dns_label(".."));
        assert!(!is_dns_label("a/b"));
        assert!(!is_dns_label("-a"));
        assert!(is_dns_subdomain("gpu.nvidia.com"));
        assert!(!is_dns_subdomain("gpu..com"));
        assert!(!is_dns_subdomain(".."));
    }
}
