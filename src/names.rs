//! Validation of every name that becomes a path component.
//!
//! Nothing from an API object reaches the filesystem without passing one of these
//! checks, so no name can escape the tree (`..`, `/`, NUL) or collide with the
//! reserved `.`-prefixed metadata entries.

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

#[cfg(test)]
mod tests {
    use super::*;

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
