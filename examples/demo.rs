//! The README's first command: slicelet's daemon against the kubelet emulator on a simulated
//! node, printing what the kubelet sees and one Allocate response; then, for each process the
//! node file runs on GPU 0, a pod holding one of GPU 0's replicas (pod-resources emulated, the
//! kubelet's device checkpoint and `/proc/<pid>/cgroup` files written as a node has them), and
//! `slicelet top --once` of the result.
//!
//! ```text
//! cargo run --example demo -- --config config/policy.yaml --simulate config/nodes/h100-80gb-x8-busy.yaml
//! ```
//!
//! With `--hold` it keeps running after printing, until Ctrl-C, and prints the command that
//! follows it from another terminal: this example's own `top` subcommand (`slicelet top`'s
//! flags, served by the library), so the binary already built serves it and nothing is
//! compiled again.
//!
//! ```text
//! target/debug/examples/demo top --address http://127.0.0.1:<port>
//! ```

use std::path::PathBuf;
use std::time::{Duration, Instant};

use clap::Parser;
use kubelet_emulator::node_files::{write_cgroup, write_checkpoint, Driver, Entry};
use kubelet_emulator::pod_resources::PodResources;
use kubelet_emulator::KubeletEmulator;
use slicelet::api;
use slicelet::daemon;
use slicelet::inventory::simulated::SimulatedSource;
use slicelet::inventory::GpuSource as _;
use slicelet::settings::Settings;
use slicelet::{plan, policy};
use tokio_util::sync::CancellationToken;

/// Run slicelet against a kubelet emulator in a temporary device-plugin directory.
#[derive(Parser)]
#[command(args_conflicts_with_subcommands = true)]
struct Args {
    #[command(subcommand)]
    command: Option<DemoCommand>,
    /// Sharing policy.
    #[arg(long, default_value = "config/policy.yaml")]
    config: PathBuf,
    /// Simulated node.
    #[arg(long, default_value = "config/nodes/h100-80gb-x8-busy.yaml")]
    simulate: PathBuf,
    /// Keep the daemon and the emulators running after printing (so `slicelet top` can be
    /// pointed at the printed address from another terminal); Ctrl-C stops it.
    #[arg(long)]
    hold: bool,
}

#[derive(clap::Subcommand)]
enum DemoCommand {
    /// `slicelet top`, from this binary: point it at the address `--hold` prints.
    Top(slicelet::cli::TopArgs),
}

/// How to run this binary from the current directory: its path relative to it where it lies
/// below it (`target/debug/examples/demo`), else the absolute path.
fn this_binary() -> String {
    let exe = std::env::current_exe().unwrap_or_else(|_| PathBuf::from("demo"));
    std::env::current_dir()
        .ok()
        .and_then(|cwd| exe.strip_prefix(cwd).ok().map(PathBuf::from))
        .unwrap_or_else(|| exe.clone())
        .display()
        .to_string()
}

/// The command `--hold` prints, to follow the demo from another terminal.
fn top_command(binary: &str, address: std::net::SocketAddr) -> String {
    format!("{binary} top --address http://{address}")
}

#[tokio::main(flavor = "multi_thread", worker_threads = 2)]
async fn main() -> anyhow::Result<()> {
    let args = Args::parse();
    if let Some(DemoCommand::Top(top)) = &args.command {
        return Ok(slicelet::top::run(&top.source(), top.once).await?);
    }
    tracing_subscriber::fmt()
        .with_env_filter(
            tracing_subscriber::EnvFilter::try_from_env("SLICELET_LOG")
                .unwrap_or_else(|_| "info".into()),
        )
        .with_writer(std::io::stderr)
        .init();
    let dir = tempfile::tempdir()?;
    let plugins = dir.path().join("device-plugins");
    let mut settings = Settings::new(&args.config, &plugins);
    settings.simulate = Some(args.simulate.clone());
    let host = dir.path().join("host");
    settings.proc_root = host.clone();
    settings.pod_resources_socket = Some(dir.path().join("pod-resources/kubelet.sock"));
    settings.status_address = Some("127.0.0.1:0".parse()?);
    settings.sample_interval = Some(Duration::from_millis(250));

    // What the policy should produce here, to know when the kubelet has seen all of it.
    let policy = policy::load(&args.config)?;
    let (inventory, source) = daemon::discover(&settings)?;
    let expected = plan::build(&policy, &inventory)?.plan;

    let pods = PodResources::start(settings.pod_resources_socket.as_deref().expect("set")).await?;
    let emu = KubeletEmulator::start(&plugins).await?;
    let token = CancellationToken::new();
    let started = Instant::now();
    let (status_tx, mut status) = tokio::sync::watch::channel(slicelet::status::Status::default());
    let daemon = tokio::spawn(daemon::run_with_status(
        settings.clone(),
        token.clone(),
        status_tx,
    ));
    let state = emu
        .wait_for(Duration::from_secs(30), |s| {
            expected
                .resources
                .iter()
                .all(|(name, r)| s.device_count(name) == Some(r.devices.len()))
        })
        .await?;
    let took = started.elapsed();

    println!("kubelet emulator in {} sees {source}:", plugins.display());
    println!(
        "{:<28} {:<44} {:>8} {:>8}",
        "RESOURCE", "ENDPOINT", "DEVICES", "HEALTHY"
    );
    for (name, r) in &state.resources {
        println!(
            "{name:<28} {:<44} {:>8} {:>8}",
            r.endpoint,
            state.device_count(name).unwrap_or(0),
            state.healthy_count(name).unwrap_or(0)
        );
    }
    println!(
        "start -> every device list at the kubelet: {:.1} ms",
        took.as_secs_f64() * 1e3
    );

    let (name, r) = state
        .resources
        .iter()
        .next()
        .expect("at least one resource");
    let available: Vec<String> = r.devices.iter().flatten().map(|d| d.id.clone()).collect();
    let mut client = emu.client(name).await?;
    let preferred = client
        .get_preferred_allocation(api::PreferredAllocationRequest {
            container_requests: vec![api::ContainerPreferredAllocationRequest {
                available_device_i_ds: available,
                must_include_device_i_ds: vec![],
                allocation_size: 1,
            }],
        })
        .await?
        .into_inner();
    let ids = preferred.container_responses[0].device_i_ds.clone();
    println!("\nGetPreferredAllocation({name}, size 1) -> {ids:?}");
    let resp = client
        .allocate(api::AllocateRequest {
            container_requests: vec![api::ContainerAllocateRequest { devices_ids: ids }],
        })
        .await?
        .into_inner();
    println!("Allocate -> container environment:");
    for (k, v) in &resp.container_responses[0].envs {
        println!("  {k}={v}");
    }

    // GPU use: one pod per process the node file runs on GPU 0, each holding one of GPU 0's
    // replicas, as the kubelet records it (pod-resources, its device checkpoint) and as the
    // container runtime places the process (its cgroup).
    let gpu0 = &inventory.gpus[0].uuid;
    let replicas: Vec<String> = r
        .devices
        .iter()
        .flatten()
        .map(|d| d.id.clone())
        .filter(|id| id.starts_with(&format!("{gpu0}::")))
        .collect();
    let mut source = SimulatedSource::new(&args.simulate);
    let processes: Vec<u32> = source
        .sample()?
        .first()
        .map(|g| g.processes.iter().map(|p| p.pid).collect())
        .unwrap_or_default();
    let mut uids = Vec::new();
    for (i, (pid, id)) in processes.iter().zip(&replicas).enumerate() {
        let uid = format!("00000000-0000-4000-8000-{i:012}");
        let pod = format!("llm-{i}");
        client
            .allocate(api::AllocateRequest {
                container_requests: vec![api::ContainerAllocateRequest {
                    devices_ids: vec![id.clone()],
                }],
            })
            .await?;
        pods.hold("demo", &pod, "server", name, &[id]);
        let container_id: String = format!("{i:x}").repeat(64).chars().take(64).collect();
        write_cgroup(
            &host,
            *pid,
            Driver::Systemd,
            Some("burstable"),
            &uid,
            &container_id,
        )?;
        uids.push((uid, id.clone()));
    }
    if !uids.is_empty() {
        let entries: Vec<Entry<'_>> = uids
            .iter()
            .map(|(uid, id)| Entry {
                pod_uid: uid,
                container: "server",
                resource: name,
                device_ids: std::slice::from_ref(id),
            })
            .collect();
        write_checkpoint(&plugins.join("kubelet_internal_checkpoint"), &entries)?;
        // pod-resources is read 0.5 s after an Allocate; then one more sample.
        let wait = Duration::from_secs(30);
        let held = uids.len();
        let s = tokio::time::timeout(wait, status.wait_for(|s| s.in_use == held))
            .await??
            .samples;
        tokio::time::timeout(wait, status.wait_for(|st| st.samples > s)).await??;
        let address = status.borrow().address.expect("status endpoint");
        println!(
            "\n{} pods on GPU 0; slicelet top --once --address http://{address}:",
            uids.len()
        );
        print!(
            "{}",
            slicelet::top::once(&format!("http://{address}")).await?
        );
    }

    if args.hold {
        let address = status.borrow().address.expect("status endpoint");
        println!(
            "\nholding: in another terminal, {}  (Ctrl-C stops the demo)",
            top_command(&this_binary(), address)
        );
        tokio::signal::ctrl_c().await?;
    }
    token.cancel();
    daemon.await??;
    println!("\ndaemon stopped: streams ended, sockets removed");
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    /// What `--hold` prints runs this binary's own `top` (nothing to build), at the address.
    #[test]
    fn the_printed_top_command_is_this_binarys_top_at_the_address() {
        let line = top_command(
            "target/debug/examples/demo",
            "127.0.0.1:45895".parse().unwrap(),
        );
        let words: Vec<&str> = line.split_whitespace().collect();
        assert_eq!(words[0], "target/debug/examples/demo", "{line}");
        let args = Args::try_parse_from(&words).unwrap_or_else(|e| panic!("{line}: {e}"));
        let Some(DemoCommand::Top(top)) = args.command else {
            panic!("{line}: not the top subcommand");
        };
        assert!(
            matches!(top.source(), slicelet::top::Source::Local(a) if a == "http://127.0.0.1:45895"),
            "{line}"
        );
    }
}
