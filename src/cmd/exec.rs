//! `drafs exec`: set environment variables from device values and run a
//! command in place of drafs (an entrypoint wrapper).

use std::os::unix::process::CommandExt;
use std::path::{Path, PathBuf};

use tracing::info;

use crate::cmd::cli::ExecArgs;
use crate::cmd::config::{self, Select, Source};
use crate::cmd::get::printable;
use crate::cmd::{Failure, resolve_once};
use crate::model::envvars::{self, EnvSpec, ValueSource};
use crate::model::layout;
use crate::model::tree;

/// Where the values come from.
#[derive(Debug)]
pub enum Values {
    /// A tree written by `init` or served by `serve` (`--from-dir`).
    Dir(PathBuf),
    /// Resolved once, from the file or the API.
    Resolved(Box<Source>, Select),
}

#[derive(Debug)]
pub struct Config {
    pub env: Vec<EnvSpec>,
    pub values: Values,
    pub optional: bool,
    pub program: String,
    pub args: Vec<String>,
}

impl Config {
    pub fn from_args(args: &ExecArgs) -> Result<Self, Failure> {
        let (program, rest) =
            args.command.split_first().ok_or_else(|| Failure::Usage("no command given after --".into()))?;
        let values = match &args.from_dir {
            Some(dir) => Values::Dir(dir.clone()),
            None => Values::Resolved(Box::new(config::source(&args.source)?), Select::from_args(&args.select)),
        };
        Ok(Config {
            env: args.env.clone(),
            values,
            optional: args.optional,
            program: program.clone(),
            args: rest.to_vec(),
        })
    }
}

/// `exec`: set the variables and replace this process with the command.
pub async fn run(c: Config) -> Result<(), Failure> {
    let vars = match &c.values {
        // No tree there is a mistake (a wrong path, a missing mount), not a missing value.
        Values::Dir(dir) if !dir.join(layout::RECORD).exists() => {
            return Err(Failure::Failed(format!(
                "no drafs tree at {} (no {} there): check --from-dir and that the volume is mounted",
                dir.display(),
                layout::RECORD
            )));
        }
        Values::Dir(dir) => envvars::values(&c.env, &DirSource(dir.clone()), c.optional),
        Values::Resolved(source, select) => {
            let res = resolve_once(source, select).await?;
            envvars::values(&c.env, &tree::build(&res, &[]).tree, c.optional)
        }
    }
    .map_err(|e| Failure::Failed(e.to_string()))?;
    let (program, rest) = (&c.program, &c.args);
    // A value is a driver's text: escaped, it cannot forge a log line or drive a terminal.
    for (name, value) in &vars {
        info!(%name, value = %printable(value), "setting");
    }
    let err = std::process::Command::new(program).args(rest).envs(vars).exec();
    Err(Failure::Failed(format!("cannot run {program}: {err}")))
}

/// A tree written by `init` or served by `serve`.
struct DirSource(pub PathBuf);

impl ValueSource for DirSource {
    fn value(&self, rel: &str) -> Option<String> {
        std::fs::read_to_string(Path::new(&self.0).join(rel)).ok()
    }

    fn indices(&self, claim: &str, request: &str) -> Vec<usize> {
        let mut out: Vec<usize> = std::fs::read_dir(self.0.join(claim).join(request))
            .map(|d| d.flatten().filter_map(|e| e.file_name().to_str()?.parse().ok()).collect())
            .unwrap_or_default();
        out.sort_unstable();
        out
    }
}
