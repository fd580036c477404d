//! `drafs get`: resolve once and print the devices and their attributes, as
//! a table, the tree's JSON record or every file of the tree.

use std::io::Write;

use crate::cmd::cli::{GetArgs, Output};
use crate::cmd::config::{self, Select, Source};
use crate::cmd::{Failure, log_tree_warnings, resolve_once};
use crate::model::layout;
use crate::model::resolve::{ClaimOrigin, Resolution};
use crate::model::tree::{self, BuiltTree, EntryKind};

#[derive(Debug)]
pub struct Config {
    pub output: Output,
    pub source: Source,
    pub select: Select,
}

impl Config {
    pub fn from_args(args: &GetArgs) -> Result<Self, Failure> {
        let (source, select) = (config::source(&args.source)?, Select::from_args(&args.select));
        Ok(Config { output: args.output, source, select })
    }
}

/// Print, and exit 0 only when everything is there.
pub async fn run(c: Config) -> Result<(), Failure> {
    let res = resolve_once(&c.source, &c.select).await?;
    let built = tree::build(&res, &[]);
    if matches!(c.source, Source::File { .. }) {
        log_tree_warnings(&res, &built);
    }
    let mut out = std::io::stdout().lock();
    let printed = match c.output {
        Output::Json => out.write_all(built.tree.get(layout::RECORD).unwrap_or_default()).and_then(|_| writeln!(out)),
        Output::Table => out.write_all(table(&res).as_bytes()),
        Output::Tree => out.write_all(tree_listing(&built).as_bytes()),
    };
    match printed {
        Err(e) if e.kind() != std::io::ErrorKind::BrokenPipe => {
            return Err(Failure::Failed(format!("cannot write to stdout: {e}")));
        }
        _ => {}
    }
    if built.is_ready() { Ok(()) } else { Err(Failure::Failed(format!("incomplete: {}", built.missing.join("; ")))) }
}

/// Text safe for a terminal: control characters (escape sequences, newlines)
/// in values a driver or a claim wrote are shown escaped, never sent raw.
pub fn printable(text: &str) -> String {
    if !text.chars().any(char::is_control) {
        return text.to_string();
    }
    text.chars().map(|c| if c.is_control() { c.escape_default().to_string() } else { c.to_string() }).collect()
}

/// [`printable`], cut at `max` characters (an ellipsis says so): for one
/// line an operator or the kubelet's probe output shows.
pub fn printable_bounded(text: &str, max: usize) -> String {
    match crate::model::names::cut(text, max) {
        (head, true) => format!("{}…", printable(head)),
        (text, false) => printable(text),
    }
}

/// Every file of the tree and its content; JSON records are summarized.
pub fn tree_listing(built: &BuiltTree) -> String {
    let mut text = String::new();
    for (path, content) in built.tree.files() {
        let shown = if path.ends_with(layout::RECORD) {
            format!("({} bytes of JSON)", content.len())
        } else {
            printable(&String::from_utf8_lossy(content))
        };
        text.push_str(&format!("{}  {shown}\n", printable(path)));
    }
    text
}

/// One row per attribute, capacity, consumed capacity, status and health value, in aligned columns.
/// An extended resource's request is shown as its tree directory, the container
/// (`trainer (container-1-request-0)`).
pub fn table(res: &Resolution) -> String {
    let mut rows =
        vec![["CLAIM", "REQUEST", "INDEX", "DRIVER", "DEVICE", "ATTRIBUTE", "VALUE"].map(String::from).to_vec()];
    for claim in &res.claims {
        for device in &claim.devices {
            let request = match claim.origin {
                ClaimOrigin::ExtendedResource => format!("{} ({})", device.request, device.full_request),
                _ => device.full_request.clone(),
            };
            for (name, kind, value) in tree::device_entries(device) {
                use EntryKind::*;
                if matches!(kind, Attribute | Capacity | Consumed | Status | Health) {
                    let row = [
                        claim.pod_claim.as_str(),
                        request.as_str(),
                        &device.index.to_string(),
                        device.driver.as_str(),
                        device.device.as_str(),
                        &name,
                        &value,
                    ];
                    rows.push(row.iter().map(|cell| printable(cell)).collect());
                }
            }
        }
    }
    let widths: Vec<usize> = (0..7).map(|c| rows.iter().map(|r| r[c].chars().count()).max().unwrap_or(0)).collect();
    let mut text = String::new();
    for row in rows {
        let cells: Vec<String> = row.iter().zip(&widths).map(|(cell, w)| format!("{cell:<w$}")).collect();
        text.push_str(cells.join("  ").trim_end());
        text.push('\n');
    }
    text
}
