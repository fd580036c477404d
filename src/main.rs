//! drafs: entry point. Parses flags, sets up logging and the runtime, runs one
//! command, and turns its outcome into an exit code.

use clap::Parser;
use tracing_subscriber::EnvFilter;

use drafs::app::{self, Failure};
use drafs::cli::{Backend, Cli, Command, LogFormat, ManifestsCommand};

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
    let cli = Cli::parse();
    let default_level = match cli.command {
        Command::Get(_) | Command::Probe(_) | Command::Exec(_) | Command::Manifests(_) => "warn",
        _ => "info",
    };
    init_tracing(cli.global.log_format, default_level);

    // A FUSE server runs under a supervisor that unmounts its tree if it is
    // killed; forked here, while the process still has one thread.
    if let Command::Serve(args) = &cli.command
        && args.backend == Backend::Fuse
    {
        match drafs::supervisor::fork_server(&args.output.dir) {
            Ok(drafs::supervisor::Role::Server) => {}
            Ok(drafs::supervisor::Role::Done(code)) => std::process::exit(code),
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
    let outcome: Result<(), Failure> = runtime.block_on(async {
        // The webhook drains its reviews in flight on a signal, so it gets the
        // signal instead of being dropped.
        if let Command::Webhook(args) = &cli.command {
            return app::webhook(args, async {
                let signal = shutdown_signal().await;
                tracing::info!("{signal}: stopping");
            })
            .await;
        }
        let work = async {
            match &cli.command {
                Command::Init(args) => app::init(args).await,
                Command::Serve(args) => app::serve(args).await,
                Command::Probe(args) => app::probe(args),
                Command::Unmount(args) => {
                    drafs::fuse::unmount_ours(&args.dir).map_err(|e| Failure::Failed(e.to_string()))
                }
                Command::Get(args) => app::get(args).await,
                Command::Exec(args) => app::exec(args).await,
                Command::CopySelf(args) => app::copy_self(args),
                Command::Inject(args) => app::inject(args),
                Command::Manifests(ManifestsCommand::Rbac(args)) => app::manifests_rbac(args),
                Command::Webhook(_) => unreachable!("served above"),
            }
        };
        // On a signal the command's future is dropped, which unmounts a FUSE tree.
        tokio::select! {
            result = work => result,
            signal = shutdown_signal() => match cli.command {
                Command::Serve(_) => {
                    tracing::info!("{signal}: stopping");
                    Ok(())
                }
                _ => Err(Failure::Failed(format!("stopped by {signal}"))),
            },
        }
    });
    // Exit without waiting for the runtime to wind down its idle connections and
    // threads: the outputs are complete, and an init container's exit is what
    // starts the app.
    let _ = std::io::Write::flush(&mut std::io::stdout());
    match outcome {
        Ok(()) => std::process::exit(0),
        Err(failure) => {
            match cli.global.log_format {
                LogFormat::Json => tracing::error!("{failure}"),
                LogFormat::Text => eprintln!("drafs: {failure}"),
            }
            std::process::exit(failure.exit_code());
        }
    }
}

/// Resolves on SIGTERM or SIGINT, naming the signal.
async fn shutdown_signal() -> &'static str {
    use tokio::signal::unix::{SignalKind, signal};
    let (Ok(mut term), Ok(mut int)) = (signal(SignalKind::terminate()), signal(SignalKind::interrupt())) else {
        return std::future::pending().await;
    };
    tokio::select! {
        _ = term.recv() => "SIGTERM",
        _ = int.recv() => "SIGINT",
    }
}
