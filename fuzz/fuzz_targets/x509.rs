//! Any certificate bytes `drafs check` could be served or find in a caBundle:
//! the webhook check, which reads a certificate's validity period with the
//! webhook's own DER date parser (`admission::x509::validity`, UTCTime and
//! GeneralizedTime), never panics, and reads the same expiry from the bytes
//! as the served leaf and as the caBundle's PEM.
#![no_main]

use drafs::admission::check::{Probe, Reach, webhook};
use libfuzzer_sys::fuzz_target;
use rustls_pki_types::CertificateDer;
use rustls_pki_types::pem::PemObject;

/// 2023-11-14T22:13:20Z.
const NOW: i64 = 1_700_000_000;

fuzz_target!(|data: &[u8]| {
    let pem = pem(data);
    let probe = Probe {
        entry: "fuzz".into(),
        endpoint: "https://127.0.0.1:8443/mutate".into(),
        server_name: "drafs-webhook.drafs.svc".into(),
        ca_bundle: pem.clone(),
        reach: Reach::Answered { status: 200, through: "directly".into() },
        served: Some(Ok(vec![CertificateDer::from(data.to_vec())])),
    };
    let check = webhook(&probe, NOW, 14);
    assert!(!check.message.contains('\n'), "a message of several lines: {:?}", check.message);
    let anchors: Vec<CertificateDer> = CertificateDer::pem_slice_iter(&pem).filter_map(Result::ok).collect();
    if anchors.len() == 1 && anchors[0].as_ref() == data {
        let (ca, served) = (&check.details["ca"]["notAfter"], &check.details["certificate"]["notAfter"]);
        assert_eq!(ca, served, "the same bytes expire at two times: {:?}", check.details);
    }
});

/// `data` as one PEM CERTIFICATE block.
fn pem(data: &[u8]) -> Vec<u8> {
    const ALPHABET: &[u8; 64] = b"ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789+/";
    let mut b64 = Vec::with_capacity(data.len().div_ceil(3) * 4);
    for chunk in data.chunks(3) {
        let n = chunk.iter().enumerate().fold(0u32, |n, (i, &b)| n | u32::from(b) << (16 - 8 * i));
        for i in 0..4 {
            b64.push(if i <= chunk.len() { ALPHABET[(n >> (18 - 6 * i) & 63) as usize] } else { b'=' });
        }
    }
    let mut out = b"-----BEGIN CERTIFICATE-----\n".to_vec();
    for line in b64.chunks(64) {
        out.extend_from_slice(line);
        out.push(b'\n');
    }
    out.extend_from_slice(b"-----END CERTIFICATE-----\n");
    out
}
