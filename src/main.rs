//! The `slicelet` binary: parse the command line, install logging, run until SIGTERM/SIGINT,
//! map the outcome to an exit code (0 ok, 1 error). All logic lives in the library.

use std::process::ExitCode;

use anyhow::Context as _;
use clap::Parser;
use slicelet::cli::{
    Cli, Command, HookCommand, InstallHookArgs, LogFormat, MigCommand, OutputFormat,
    SetMemoryLimitsArgs,
};
use tokio_util::sync::CancellationToken;
use tracing_subscriber::EnvFilter;

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
                .block_on(slicelet::top::run(&args.source(), args.once))
                .context("slicelet top")
        }
        Command::Hook(HookCommand::SetMemoryLimits(a)) => set_memory_limits(a),
        Command::InstallHook(args) => install_hook(&args),
        Command::Mig(MigCommand::Create(a)) => {
            let made = slicelet::commands::mig::create(
                &a.source.settings(),
                &a.gpu,
                &a.profile,
                a.placement,
            )?;
            println!("{made}");
            Ok(())
        }
        Command::Mig(MigCommand::Destroy(a)) => {
            println!(
                "{}",
                slicelet::commands::mig::destroy(&a.source.settings(), &a.uuid)?
            );
            Ok(())
        }
        Command::Validate(args) => {
            let out = slicelet::commands::validate_config(&args.settings()?, args.strict)?;
            print!("{out}");
            Ok(())
        }
    }
}

/// `slicelet hook set-memory-limits`: sets the limits, reporting what was set on stderr; a
/// failure is an error only under `enforce: required`.
fn set_memory_limits(a: SetMemoryLimitsArgs) -> anyhow::Result<()> {
    let req = slicelet::hook::Request {
        gpu: a.gpu,
        hard_mib: a.hard_mib,
        soft_mib: a.soft_mib,
        enforce: a.enforce,
        nvml_library: a.nvml_library,
        cgroup_root: a.cgroup_root,
        deadline: a.deadline_seconds,
    };
    slicelet::hook::start_watchdog(&req);
    match slicelet::hook::set_memory_limits(&req, std::io::stdin().lock()) {
        Ok(o) => {
            let mib = |b: u64| b / (1024 * 1024);
            let added = o.before.map_or(String::new(), |b| {
                format!(
                    " ({} MiB added to the {} MiB another device of the container set)",
                    req.hard_mib,
                    mib(b.hard)
                )
            });
            eprintln!(
                "slicelet hook: GPU {}: {} MiB hard, {} MiB soft set for {}{added}",
                req.gpu,
                mib(o.read.hard),
                mib(o.read.soft),
                o.cgroup.display()
            );
            Ok(())
        }
        Err(e) if req.enforce == slicelet::policy::Enforce::BestEffort => {
            eprintln!("slicelet hook: not enforced (best-effort): {e}");
            Ok(())
        }
        Err(e) => {
            Err(anyhow::Error::new(e).context("GPU memory limit not set under enforce: required"))
        }
    }
}

/// `slicelet install-hook`: copies this binary to `--to`, saying on stderr what it did.
fn install_hook(args: &InstallHookArgs) -> anyhow::Result<()> {
    let installed = slicelet::commands::install_hook(&args.to)
        .with_context(|| format!("installing the hook binary at {}", args.to.display()))?;
    match installed {
        slicelet::commands::Installed::Written(bytes) => eprintln!(
            "slicelet install-hook: {} written ({bytes} bytes, mode 0755)",
            args.to.display()
        ),
        slicelet::commands::Installed::Unchanged => eprintln!(
            "slicelet install-hook: {} is this binary already",
            args.to.display()
        ),
    }
    Ok(())
}

fn main() -> ExitCode {
    let cli = Cli::parse();
    init_logging(cli.log_format);
    let daemon = matches!(cli.command, Command::Run(_) | Command::Mps(_));
    if daemon {
        // A long-running daemon: at most two malloc arenas.
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
