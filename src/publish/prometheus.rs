//! The Prometheus text exposition format (version 0.0.4), written in one
//! place for drafs's two metrics endpoints: `publish::metrics` (`init`,
//! `serve`) and the webhook's (`admission::webhook::metrics`). One writer,
//! so that the `# HELP` and `# TYPE` lines, label escaping and the layout of
//! a histogram cannot drift apart between them.

use std::fmt::{Display, Write as _};

/// The content type of the text format.
pub const CONTENT_TYPE: &str = "text/plain; version=0.0.4";

/// A metric family's type, as its `# TYPE` line says it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Kind {
    Counter,
    Gauge,
    Histogram,
}

impl Kind {
    fn name(self) -> &'static str {
        match self {
            Kind::Counter => "counter",
            Kind::Gauge => "gauge",
            Kind::Histogram => "histogram",
        }
    }
}

/// Prometheus text being written: families, each a header and its samples.
#[derive(Debug, Default)]
pub struct Text(String);

impl Text {
    /// A family's `# HELP` and `# TYPE` lines; its samples follow.
    pub fn family(&mut self, name: &str, kind: Kind, help: &str) -> &mut Self {
        let _ = writeln!(self.0, "# HELP {name} {help}\n# TYPE {name} {}", kind.name());
        self
    }

    /// One sample line, `name{labels} value` (no braces without labels);
    /// label values are escaped.
    pub fn sample(&mut self, name: &str, labels: &[(&str, &str)], value: impl Display) -> &mut Self {
        self.0.push_str(name);
        if !labels.is_empty() {
            let labels: Vec<String> = labels.iter().map(|(k, v)| format!("{k}=\"{}\"", escape_label(v))).collect();
            let _ = write!(self.0, "{{{}}}", labels.join(","));
        }
        let _ = writeln!(self.0, " {value}");
        self
    }

    /// A family of one unlabelled sample.
    pub fn single(&mut self, name: &str, kind: Kind, help: &str, value: impl Display) -> &mut Self {
        self.family(name, kind, help).sample(name, &[], value)
    }

    /// A histogram: the cumulative count of observations at or under each
    /// bound of `bounds` (in seconds), then `+Inf`, the sum (in seconds, to
    /// the microsecond) and the count.
    pub fn histogram(&mut self, name: &str, help: &str, bounds: &[f64], cumulative: &[u64], count: u64, sum: f64) {
        self.family(name, Kind::Histogram, help);
        let bucket = format!("{name}_bucket");
        for (bound, n) in bounds.iter().zip(cumulative) {
            self.sample(&bucket, &[("le", &bound.to_string())], n);
        }
        self.sample(&bucket, &[("le", "+Inf")], count);
        self.sample(&format!("{name}_sum"), &[], format_args!("{sum:.6}"));
        self.sample(&format!("{name}_count"), &[], count);
    }

    pub fn into_text(self) -> String {
        self.0
    }
}

/// `drafs_build_info{version,revision} 1`: which drafs answers, for every
/// metrics endpoint (the webhook, the node agent, a sidecar).
pub fn build_info() -> String {
    let mut out = Text::default();
    let revision = option_env!("DRAFS_REVISION").unwrap_or_default();
    out.family("drafs_build_info", Kind::Gauge, "1, with the version and the commit drafs was built from.").sample(
        "drafs_build_info",
        &[("version", env!("CARGO_PKG_VERSION")), ("revision", revision)],
        1,
    );
    out.into_text()
}

/// A label value in the exposition format: backslash, quote and newline escaped.
pub fn escape_label(value: &str) -> String {
    value.replace('\\', "\\\\").replace('"', "\\\"").replace('\n', "\\n")
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn families_samples_and_histograms_in_the_text_format() {
        let mut out = Text::default();
        out.family("a_total", Kind::Counter, "As.");
        out.sample("a_total", &[("code", "500"), ("path", "a\"b\\c\nd")], 2);
        out.single("b", Kind::Gauge, "B.", "0.250");
        out.histogram("c_seconds", "C.", &[0.0005, 1.0], &[1, 2], 3, 12.5);
        assert_eq!(
            out.into_text(),
            "# HELP a_total As.\n# TYPE a_total counter\na_total{code=\"500\",path=\"a\\\"b\\\\c\\nd\"} 2\n\
             # HELP b B.\n# TYPE b gauge\nb 0.250\n\
             # HELP c_seconds C.\n# TYPE c_seconds histogram\nc_seconds_bucket{le=\"0.0005\"} 1\n\
             c_seconds_bucket{le=\"1\"} 2\nc_seconds_bucket{le=\"+Inf\"} 3\nc_seconds_sum 12.500000\nc_seconds_count 3\n"
        );
        assert_eq!(escape_label("a\"b\\c\nd"), r#"a\"b\\c\nd"#);
    }
}
