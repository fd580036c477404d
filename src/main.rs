//! drafs: entry point. Parses flags, checks them into a command's config, sets
//! up logging and the runtime, runs the command, and turns its outcome into an
//! exit code.

use clap::Parser;
use tracing_subscriber::EnvFilter;

use drafs::cmd::cli::{Cli, Command, LogFormat};
use drafs::cmd::{self, Config, Failure, Stop};

fn init_tracing(format: LogFormat, default_level: &str) {
    // DRAFS_LOG wins over RUST_LOG; both take tracing's env-filter syntax.
    let filter = std::env::var("DRAFS_LOG")
        .or_else(|_| std::env::var("RUST_LOG"))
        .ok()
        .and_then(|f| EnvFilter::try_new(f).ok())
        // kube_client logs each failed request at error level; drafs reports them itself.
        .unwrap_or_else(|| EnvFilter::new(format!("{default_level},kube_client=off,kube_runtime=warn,hyper=warn")));
    let ansi = std::io::IsTerminal::is_terminal(&std::io::stderr());
    let builder = tracing_subscriber::fmt().with_env_filter(filter).with_writer(std::io::stderr).with_ansi(ansi);
    match format {
        LogFormat::Json => builder.json().flatten_event(true).init(),
        LogFormat::Text => builder.with_target(false).init(),
    }
}

fn main() {
    // Before anything else: a stop signal waits for its handler (cmd::Stop).
    cmd::hold_stop_signals();
    // A panic aborts the process, except one while deciding a webhook review.
    drafs::admission::contain::install_panic_policy();
    let cli = Cli::parse();
    let default_level = match cli.command {
        Command::Get(_) | Command::Probe(_) | Command::Exec(_) | Command::Manifests(_) | Command::Check(_) => "warn",
        _ => "info",
    };
    let log_format = cli.global.log_format;
    init_tracing(log_format, default_level);
    // Flags are checked before anything starts: a bad combination is exit 2.
    let config = Config::from_command(&cli.command).unwrap_or_else(|failure| exit(log_format, Err(failure)));

    // A FUSE server runs under a supervisor that unmounts its tree if it is
    // killed; forked here, while the process still has one thread.
    if let Some(dir) = config.fuse_dir() {
        match drafs::publish::supervisor::fork_server(dir) {
            Ok(drafs::publish::supervisor::Role::Server) => {}
            Ok(drafs::publish::supervisor::Role::Done(code)) => std::process::exit(code),
            Err(e) => {
                eprintln!("drafs: cannot start the FUSE server: {e}");
                std::process::exit(1);
            }
        }
    }

    let runtime = match tokio::runtime::Builder::new_current_thread().enable_all().build() {
        Ok(rt) => rt,
        Err(e) => {
            eprintln!("drafs: cannot start the async runtime: {e}");
            std::process::exit(1);
        }
    };
    // The signal handlers are in place before the command starts; what a
    // signal means is the command's to say (drain, unmount, or fail).
    let outcome = runtime.block_on(async {
        let stop = Stop::install();
        cmd::run(config, stop).await
    });
    exit(log_format, outcome)
}

/// Exit without waiting for the runtime to wind down its idle connections and
/// threads: the outputs are complete, and an init container's exit is what
/// starts the app.
fn exit(log_format: LogFormat, outcome: Result<(), Failure>) -> ! {
    let _ = std::io::Write::flush(&mut std::io::stdout());
    match outcome {
        Ok(()) => std::process::exit(0),
        Err(failure) => {
            match log_format {
                LogFormat::Json => tracing::error!("{failure}"),
                LogFormat::Text => eprintln!("drafs: {failure}"),
            }
            std::process::exit(failure.exit_code());
        }
    }
}
