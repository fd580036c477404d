//! The webhook's counters and latency histogram, and what its metrics
//! endpoint (`--metrics-addr`) answers, `/healthz` and `/readyz` included.

use std::collections::BTreeMap;
use std::sync::Mutex;
use std::sync::atomic::{AtomicBool, AtomicI64, AtomicU64, Ordering};
use std::time::Duration;

use rustls_pki_types::CertificateDer;

use crate::admission::x509::validity;
use crate::publish::metrics::Exposition;
use crate::publish::prometheus::{Kind, Text};

/// Counters and the latency histogram of the reviews.
#[derive(Debug, Default)]
pub struct WebhookMetrics {
    /// Reviews by verdict: allowed, patched, denied, bad_request.
    reviews: Mutex<BTreeMap<&'static str, u64>>,
    /// Cumulative counts per bucket of [`BUCKETS`], then the sum in microseconds.
    latency: Mutex<([u64; BUCKETS.len()], u64, u64)>,
    cert_reloads: AtomicU64,
    cert_errors: AtomicU64,
    evictions: AtomicU64,
    /// The served chain's earliest notAfter, in Unix seconds (0: none read).
    cert_not_after: AtomicI64,
    draining: AtomicBool,
}

/// Latency buckets, in seconds.
const BUCKETS: [f64; 9] = [0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.1, 1.0, 10.0];

impl WebhookMetrics {
    /// A review answered with `verdict` (a [`Verdict`](crate::admission::decision::Verdict)'s
    /// label, `bad_request` or `panicked`) in `took`.
    pub(super) fn review(&self, verdict: &'static str, took: Duration) {
        if let Ok(mut m) = self.reviews.lock() {
            *m.entry(verdict).or_default() += 1;
        }
        if let Ok(mut l) = self.latency.lock() {
            let secs = took.as_secs_f64();
            for (i, bound) in BUCKETS.iter().enumerate() {
                if secs <= *bound {
                    l.0[i] += 1;
                }
            }
            l.1 += 1;
            l.2 += took.as_micros() as u64;
        }
    }

    /// The Prometheus text exposition.
    pub fn render(&self) -> String {
        let mut out = Text::default();
        let name = "drafs_webhook_reviews_total";
        out.family(name, Kind::Counter, "Admission reviews answered, by verdict.");
        for (verdict, n) in self.reviews.lock().map(|m| m.clone()).unwrap_or_default() {
            out.sample(name, &[("verdict", verdict)], n);
        }
        let (buckets, count, sum_us) = self.latency.lock().map(|l| *l).unwrap_or_default();
        out.histogram(
            "drafs_webhook_review_seconds",
            "Time to answer a review, from its request head to its response.",
            &BUCKETS,
            &buckets,
            count,
            sum_us as f64 / 1e6,
        );
        for (name, help, value) in [
            (
                "drafs_webhook_cert_reloads_total",
                "Certificates reloaded after their files changed.",
                &self.cert_reloads,
            ),
            (
                "drafs_webhook_cert_errors_total",
                "Changed certificate files that could not be loaded or were refused (expired, not yet valid, not for --dns-name); the previous certificate stays.",
                &self.cert_errors,
            ),
            (
                "drafs_webhook_connections_evicted_total",
                "Connections closed at the connection limit because they had waited on their client longest.",
                &self.evictions,
            ),
        ] {
            out.single(name, Kind::Counter, help, value.load(Ordering::Relaxed));
        }
        let not_after = self.cert_not_after.load(Ordering::Relaxed);
        if not_after > 0 {
            out.single(
                "drafs_webhook_cert_expiry_timestamp_seconds",
                Kind::Gauge,
                "When the served certificate chain stops being valid (its earliest notAfter), in Unix seconds.",
                not_after,
            );
        }
        out.into_text()
    }

    /// Whether `/readyz` answers 200: until the drain starts.
    pub(super) fn is_ready(&self) -> bool {
        !self.draining.load(Ordering::Relaxed)
    }

    /// The drain started: `/readyz` answers 503 from now on.
    pub(super) fn start_draining(&self) {
        self.draining.store(true, Ordering::Relaxed);
    }

    pub(super) fn cert_reloaded(&self) {
        self.cert_reloads.fetch_add(1, Ordering::Relaxed);
    }

    /// The chain now served: when the first of its certificates expires.
    pub(super) fn cert_served(&self, chain: &[CertificateDer]) {
        if let Some(at) = chain.iter().filter_map(|c| validity(c)).map(|(_, not_after)| not_after).min() {
            self.cert_not_after.store(at, Ordering::Relaxed);
        }
    }

    /// Changed certificate files that could not be used.
    pub(super) fn cert_refused(&self) {
        self.cert_errors.fetch_add(1, Ordering::Relaxed);
    }

    /// A connection closed at the connection limit to make room.
    pub(super) fn evicted(&self) {
        self.evictions.fetch_add(1, Ordering::Relaxed);
    }
}

impl Exposition for WebhookMetrics {
    fn text(&self) -> String {
        self.render()
    }

    fn unready_reason(&self) -> Option<String> {
        (!self.is_ready()).then(|| "shutting down".to_string())
    }
}
