//! What a served certificate chain says about itself: its validity period
//! and the names it is for.
//!
//! Pure (bytes and a time in, an answer out), so that the webhook (which
//! refuses to serve a chain that is expired, not yet valid or not for
//! `--dns-name`: `webhook::tls`) and `drafs check` (which reports how long
//! the served certificate and the caBundle have left: `check::webhook`) read
//! a certificate the same way. The validity period is read with a small DER
//! parser of our own: webpki checks names and signatures but does not expose
//! the dates.

use std::time::SystemTime;

use rustls_pki_types::{CertificateDer, ServerName};

/// What is wrong with a certificate chain (numbered from 1, the serving certificate).
#[derive(Debug, PartialEq, Eq)]
pub enum ChainProblem {
    Unreadable(usize),
    /// The certificate's notAfter, in Unix seconds.
    Expired(usize, i64),
    /// The certificate's notBefore, in Unix seconds.
    NotYetValid(usize, i64),
    /// The name asked for, and the DNS names the certificate has.
    WrongName(String, Vec<String>),
}

/// Whether `chain` can be served at `now` to clients asking for `names`.
pub fn check_chain(chain: &[CertificateDer], names: &[ServerName], now: SystemTime) -> Result<(), ChainProblem> {
    let now = match now.duration_since(SystemTime::UNIX_EPOCH) {
        Ok(d) => i64::try_from(d.as_secs()).unwrap_or(i64::MAX),
        Err(_) => 0,
    };
    for (n, cert) in chain.iter().enumerate().map(|(i, c)| (i + 1, c)) {
        let (not_before, not_after) = validity(cert).ok_or(ChainProblem::Unreadable(n))?;
        if now > not_after {
            return Err(ChainProblem::Expired(n, not_after));
        }
        if now < not_before {
            return Err(ChainProblem::NotYetValid(n, not_before));
        }
    }
    let leaf = webpki::EndEntityCert::try_from(&chain[0]).map_err(|_| ChainProblem::Unreadable(1))?;
    for name in names {
        if leaf.verify_is_valid_for_subject_name(name).is_err() {
            let has = leaf.valid_dns_names().map(str::to_string).collect();
            return Err(ChainProblem::WrongName(name.to_str().into_owned(), has));
        }
    }
    Ok(())
}

/// The validity period (notBefore, notAfter) of a DER X.509 certificate, in
/// Unix seconds (RFC 5280 4.1: the fifth field of the TBSCertificate).
pub fn validity(der: &[u8]) -> Option<(i64, i64)> {
    let (certificate, _) = der_take(der, 0x30)?;
    let (tbs, _) = der_take(certificate, 0x30)?;
    let mut fields = tbs;
    if fields.first() == Some(&0xa0) {
        fields = der_take(fields, 0xa0)?.1; // [0] version
    }
    for tag in [0x02, 0x30, 0x30] {
        fields = der_take(fields, tag)?.1; // serialNumber, signature, issuer
    }
    let (validity, _) = der_take(fields, 0x30)?;
    let (not_before, rest) = der_time(validity)?;
    let (not_after, _) = der_time(rest)?;
    Some((not_before, not_after))
}

/// The contents of the DER element at the start of `input` if it has this
/// tag, and what follows it.
fn der_take(input: &[u8], tag: u8) -> Option<(&[u8], &[u8])> {
    let (&found, rest) = input.split_first()?;
    let (&first, rest) = rest.split_first()?;
    if found != tag {
        return None;
    }
    let (len, rest) = if first < 0x80 {
        (usize::from(first), rest)
    } else {
        let n = usize::from(first & 0x7f);
        if n == 0 || n > 4 || rest.len() < n {
            return None;
        }
        let (len, rest) = rest.split_at(n);
        (len.iter().fold(0usize, |acc, b| (acc << 8) | usize::from(*b)), rest)
    };
    (rest.len() >= len).then(|| rest.split_at(len))
}

/// A DER UTCTime or GeneralizedTime (`YYMMDDHHMMSSZ`, `YYYYMMDDHHMMSSZ`) in
/// Unix seconds, and what follows it.
fn der_time(input: &[u8]) -> Option<(i64, &[u8])> {
    let tag = *input.first()?;
    let (text, rest) = der_take(input, tag)?;
    let digits = text.strip_suffix(b"Z")?;
    if !digits.iter().all(u8::is_ascii_digit) {
        return None;
    }
    let number = |d: &[u8]| d.iter().fold(0i16, |acc, b| acc * 10 + i16::from(b - b'0'));
    let (year, rest_digits) = match (tag, digits.len()) {
        // RFC 5280 4.1.2.5.1: two-digit years are 1950 to 2049.
        (0x17, 12) => {
            let yy = number(&digits[..2]);
            (if yy >= 50 { 1900 + yy } else { 2000 + yy }, &digits[2..])
        }
        (0x18, 14) => (number(&digits[..4]), &digits[4..]),
        _ => return None,
    };
    let pair = |i: usize| i8::try_from(number(&rest_digits[i..i + 2])).ok();
    let date = jiff::civil::Date::new(year, pair(0)?, pair(2)?).ok()?;
    let time = jiff::civil::Time::new(pair(4)?, pair(6)?, pair(8)?, 0).ok()?;
    let at = jiff::tz::TimeZone::UTC.to_timestamp(date.to_datetime(time)).ok()?;
    Some((at.as_second(), rest))
}

#[cfg(test)]
pub(crate) mod tests {
    use std::time::Duration;

    use rustls_pki_types::pem::PemObject;

    use super::*;

    /// For DNS:drafs-webhook.drafs-system.svc, DNS:*.example.com,
    /// IP:127.0.0.1, valid 2020-01-01 to 2030-01-01 (UTCTime).
    pub(crate) const CERT_2030: &str = r"-----BEGIN CERTIFICATE-----
MIIBnzCCAUSgAwIBAgICEAAwCgYIKoZIzj0EAwIwDTELMAkGA1UEAwwCY2EwHhcN
MjAwMTAxMDAwMDAwWhcNMzAwMTAxMDAwMDAwWjAPMQ0wCwYDVQQDDARsZWFmMFkw
EwYHKoZIzj0CAQYIKoZIzj0DAQcDQgAEKDWj0eufiod6/feoF6stNI0wP2Nzf7A0
pzu98nBXJZkK+8jssU0/qFk0O7jIhQami/VLHuySccYCTPVqxj0646OBkTCBjjA+
BgNVHREENzA1gh5kcmFmcy13ZWJob29rLmRyYWZzLXN5c3RlbS5zdmOCDSouZXhh
bXBsZS5jb22HBH8AAAEwDAYDVR0TAQH/BAIwADAdBgNVHQ4EFgQUtnhg6UEh5ZXj
S0jf4R1BP/X7shQwHwYDVR0jBBgwFoAUZsY/DkeO7XhuUk0e5lSeWUsbb4gwCgYI
KoZIzj0EAwIDSQAwRgIhAJnSEk3t+8g8SnpQH2VoZ+E9PHYO9tVuD8j2lHcCRlnJ
AiEAwEhhZyJOAWmuBvDnPoTqMrXPu2Pceic09DJqe3EBlkY=
-----END CERTIFICATE-----
";
    /// The same key and names, valid 2020-01-01 to 2051-01-01 (GeneralizedTime after 2049).
    pub(crate) const CERT_2051: &str = r"-----BEGIN CERTIFICATE-----
MIIBnzCCAUagAwIBAgICEAEwCgYIKoZIzj0EAwIwDTELMAkGA1UEAwwCY2EwIBcN
MjAwMTAxMDAwMDAwWhgPMjA1MTAxMDEwMDAwMDBaMA8xDTALBgNVBAMMBGxlYWYw
WTATBgcqhkjOPQIBBggqhkjOPQMBBwNCAAQoNaPR65+Kh3r996gXqy00jTA/Y3N/
sDSnO73ycFclmQr7yOyxTT+oWTQ7uMiFBqaL9Use7JJxxgJM9WrGPTrjo4GRMIGO
MD4GA1UdEQQ3MDWCHmRyYWZzLXdlYmhvb2suZHJhZnMtc3lzdGVtLnN2Y4INKi5l
eGFtcGxlLmNvbYcEfwAAATAMBgNVHRMBAf8EAjAAMB0GA1UdDgQWBBS2eGDpQSHl
leNLSN/hHUE/9fuyFDAfBgNVHSMEGDAWgBRmxj8OR47teG5STR7mVJ5ZSxtviDAK
BggqhkjOPQQDAgNHADBEAiBPeuXJCKvdIHQo+UegPP/Ufk+UC3wlJn1aKz7lUUvH
hgIgcK1pwlfjGSk0j5+GieSe8WtFNTQt78EGHDUGDj3L5Uo=
-----END CERTIFICATE-----
";
    pub(crate) const Y2020: i64 = 1_577_836_800;
    pub(crate) const Y2030: i64 = 1_893_456_000;
    pub(crate) const Y2051: i64 = 2_556_144_000;

    pub(crate) fn der(pem: &str) -> CertificateDer<'static> {
        CertificateDer::from_pem_slice(pem.as_bytes()).unwrap()
    }

    pub(crate) fn at(secs: i64) -> SystemTime {
        SystemTime::UNIX_EPOCH + Duration::from_secs(secs as u64)
    }

    pub(crate) fn name(n: &str) -> ServerName<'static> {
        ServerName::try_from(n.to_string()).unwrap()
    }

    #[test]
    fn validity_reads_both_time_encodings_and_never_panics() {
        assert_eq!(validity(&der(CERT_2030)), Some((Y2020, Y2030)));
        assert_eq!(validity(&der(CERT_2051)), Some((Y2020, Y2051)));
        let whole = der(CERT_2030);
        for cut in 0..whole.len() {
            assert_eq!(validity(&whole[..cut]), None, "cut at {cut}");
        }
        assert_eq!(validity(b"\x30\x84\xff\xff\xff\xff\x30"), None);
        assert_eq!(der_time(b"\x17\x0d991301000000Z"), None, "month 13");
        assert_eq!(der_time(b"\x17\x0d4912312359+9Z"), None);
        assert_eq!(der_time(b"\x17\x0d491231235959Z").map(|t| t.0), Some(2_524_607_999), "49 is 2049");
        assert_eq!(der_time(b"\x17\x0d500101000000Z").map(|t| t.0), Some(-631_152_000), "50 is 1950");
    }

    #[test]
    fn a_chain_is_served_only_within_its_dates_and_for_its_names() {
        let chain = [der(CERT_2030)];
        let names = [name("drafs-webhook.drafs-system.svc"), name("127.0.0.1"), name("x.example.com")];
        assert_eq!(check_chain(&chain, &names, at(1_700_000_000)), Ok(()));
        assert_eq!(check_chain(&chain, &[], at(Y2030 + 1)), Err(ChainProblem::Expired(1, Y2030)));
        assert_eq!(check_chain(&chain, &[], at(Y2020 - 1)), Err(ChainProblem::NotYetValid(1, Y2020)));
        assert_eq!(
            check_chain(&chain, &[name("drafs-webhook.other.svc")], at(1_700_000_000)),
            Err(ChainProblem::WrongName(
                "drafs-webhook.other.svc".into(),
                vec!["drafs-webhook.drafs-system.svc".into(), "*.example.com".into()]
            ))
        );
        assert!(matches!(
            check_chain(&chain, &[name("10.0.0.1")], at(1_700_000_000)),
            Err(ChainProblem::WrongName(..))
        ));
        // Every certificate of the chain is within its dates.
        assert_eq!(
            check_chain(&[der(CERT_2051), der(CERT_2030)], &[], at(Y2030 + 1)),
            Err(ChainProblem::Expired(2, Y2030))
        );
        assert_eq!(
            check_chain(&[CertificateDer::from(vec![0x30, 0x00])], &[], at(0)),
            Err(ChainProblem::Unreadable(1))
        );
    }
}
