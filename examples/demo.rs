//! The README's first command: slicelet's daemon against the kubelet emulator on a simulated
//! node, printing what the kubelet sees and one Allocate response.
//!
//! ```text
//! cargo run --example demo -- --config config/policy.yaml --simulate config/nodes/h100-80gb-x8.yaml
//! ```

use std::path::PathBuf;
use std::time::{Duration, Instant};

use clap::Parser;
use kubelet_emulator::KubeletEmulator;
use slicelet::api;
use slicelet::daemon::{self, Settings};
use slicelet::{plan, policy};
use tokio_util::sync::CancellationToken;

/// Run slicelet against a kubelet emulator in a temporary device-plugin directory.
#[derive(Parser)]
struct Args {
    /// Sharing policy.
    #[arg(long, default_value = "config/policy.yaml")]
    config: PathBuf,
    /// Simulated node.
    #[arg(long, default_value = "config/nodes/h100-80gb-x8.yaml")]
    simulate: PathBuf,
}

#[tokio::main(flavor = "multi_thread", worker_threads = 2)]
async fn main() -> anyhow::Result<()> {
    let args = Args::parse();
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

    // What the policy should produce here, to know when the kubelet has seen all of it.
    let policy = policy::load(&args.config)?;
    let (inventory, source) = daemon::discover(&settings)?;
    let expected = plan::build(&policy, &inventory)?.plan;

    let emu = KubeletEmulator::start(&plugins).await?;
    let token = CancellationToken::new();
    let started = Instant::now();
    let daemon = tokio::spawn(daemon::run(settings, token.clone()));
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

    token.cancel();
    daemon.await??;
    println!("\ndaemon stopped: streams ended, sockets removed");
    Ok(())
}
