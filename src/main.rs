//! The `slicelet` binary: parse the command line, install logging, run until SIGTERM/SIGINT,
//! map the outcome to an exit code (0 ok, 1 error). All logic lives in the library.

use std::process::ExitCode;

use anyhow::Context as _;
use clap::Parser;
use slicelet::cli::{Cli, Command, LogFormat, OutputFormat};
use tokio_util::sync::CancellationToken;
use tracing_subscriber::EnvFilter;

/// `pow` for the whole process, from the `libm` crate (a Rust port of musl's), so that glibc's
/// `libm.so.6` is not loaded at all: its only caller is tokio's multi-thread scheduler (the
/// poll-time moving average, `f64::powf`), and mapping the library for it cost about 400 KiB
/// of idle RSS (its code, tables and symbol lookup pages, measured with
/// `/proc/<pid>/smaps`). Same C signature and IEEE 754 semantics as C's `pow(3)` (results
/// within 1 ulp; `errno` is not set, which no caller here reads). The linker resolves the
/// reference to this definition first, and rustc links with `--as-needed`, so `libm.so.6`
/// leaves the binary's `NEEDED` list.
#[allow(unsafe_code)]
// SAFETY: no other definition of `pow` is linked into the binary (std and the dependencies
// only call it); the function is pure and has C's `double pow(double, double)` ABI.
#[unsafe(no_mangle)]
pub extern "C" fn pow(x: f64, y: f64) -> f64 {
    libm::pow(x, y)
}

fn init_logging(format: LogFormat) {
    let filter = EnvFilter::try_from_env("SLICELET_LOG").unwrap_or_else(|_| EnvFilter::new("info"));
    use std::io::IsTerminal as _;
    let builder = tracing_subscriber::fmt()
        .with_env_filter(filter)
        .with_ansi(std::io::stderr().is_terminal())
        .with_writer(std::io::stderr);
    match format {
        LogFormat::Text => builder.init(),
        LogFormat::Json => builder.json().init(),
    }
}

/// Installs the SIGTERM/SIGINT handlers now (so a signal that arrives while the daemon starts
/// is not lost to the default action) and cancels `token` when one arrives.
fn cancel_on_signal(token: CancellationToken) -> anyhow::Result<tokio::task::JoinHandle<()>> {
    use tokio::signal::unix::{signal, SignalKind};
    let mut term = signal(SignalKind::terminate()).context("installing SIGTERM handler")?;
    let mut int = signal(SignalKind::interrupt()).context("installing SIGINT handler")?;
    Ok(tokio::spawn(async move {
        tokio::select! {
            _ = term.recv() => tracing::info!("SIGTERM: shutting down"),
            _ = int.recv() => tracing::info!("SIGINT: shutting down"),
        }
        token.cancel();
    }))
}

/// Runs `body` on a runtime of `workers` threads until it returns; SIGTERM/SIGINT cancel the
/// token it is given.
fn run_until_signal<F, E>(
    workers: usize,
    what: &'static str,
    body: impl FnOnce(CancellationToken) -> F,
) -> anyhow::Result<()>
where
    F: std::future::Future<Output = Result<(), E>>,
    E: std::error::Error + Send + Sync + 'static,
{
    let runtime = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(workers)
        .enable_all()
        .build()
        .context("starting the tokio runtime")?;
    let result = runtime.block_on(async {
        let token = CancellationToken::new();
        let signals = cancel_on_signal(token.clone())?;
        let result = body(token).await;
        signals.abort();
        result.context(what)
    });
    // A blocking task still stuck (an NVML call on a GPU that fell off the bus, a policy read
    // on a hung file system) must not hold the exit: the daemon already stopped everything.
    runtime.shutdown_timeout(std::time::Duration::from_millis(500));
    result
}

fn run(cli: Cli) -> anyhow::Result<()> {
    match cli.command {
        Command::Run(args) => {
            let settings = args.settings()?;
            run_until_signal(usize::from(args.worker_threads), "slicelet run", |token| {
                slicelet::daemon::run(settings, token)
            })
        }
        Command::Mps(args) => {
            let settings = args.settings()?;
            run_until_signal(2, "slicelet mps", |token| {
                slicelet::daemon::run_mps(settings, token)
            })
        }
        Command::Plan(args) => {
            let out = slicelet::commands::plan(
                &slicelet::commands::resolve(&args.node.settings()?)?,
                args.output == OutputFormat::Json,
            )?;
            print!("{out}");
            Ok(())
        }
        Command::Top(args) => {
            let runtime = tokio::runtime::Builder::new_current_thread()
                .enable_all()
                .build()
                .context("starting the tokio runtime")?;
            runtime
                .block_on(slicelet::top::run(&args.address, args.once))
                .context("slicelet top")
        }
        Command::Validate(args) => {
            let out = slicelet::commands::validate_config(&args.settings()?, args.strict)?;
            print!("{out}");
            Ok(())
        }
    }
}

fn main() -> ExitCode {
    let cli = Cli::parse();
    init_logging(cli.log_format);
    let daemon = matches!(cli.command, Command::Run(_) | Command::Mps(_));
    if daemon {
        // A long-running daemon: keep only the code and heap it uses while idle resident.
        slicelet::residency::enable();
    }
    match run(cli) {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) if daemon => {
            tracing::error!("{}", slicelet::errors::chain(e.as_ref()));
            ExitCode::FAILURE
        }
        Err(e) => {
            eprintln!("error: {}", slicelet::errors::chain(e.as_ref()));
            ExitCode::FAILURE
        }
    }
}

#[cfg(test)]
mod tests {
    /// The process-wide `pow` answers as C's does: exactly where the result is exact, IEEE 754
    /// special cases, and tokio's use (`(1 - alpha)^n` of its poll-time moving average).
    #[test]
    fn pow_answers_as_c_does() {
        assert_eq!(super::pow(2.0, 10.0), 1024.0);
        assert_eq!(super::pow(0.5, 3.0), 0.125);
        assert_eq!(super::pow(9.0, 0.5), 3.0);
        assert_eq!(super::pow(7.0, 0.0), 1.0);
        assert_eq!(super::pow(f64::NAN, 0.0), 1.0);
        assert_eq!(super::pow(0.0, -1.0), f64::INFINITY);
        assert!(super::pow(-1.0, 0.5).is_nan());
        assert_eq!(super::pow(0.9, 16.0), 0.18530201888518416);
        assert_eq!(super::pow(2.0, 0.5), std::f64::consts::SQRT_2);
    }
}
