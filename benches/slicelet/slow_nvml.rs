//! 7. A slow NVML: memory queries delayed 400 ms, re-discovery (SIGHUP) every 200 ms for
//!    10 s, while one caller measures Allocate over the socket; the same without the delay.

use std::sync::atomic::Ordering;
use std::sync::Arc;
use std::time::{Duration, Instant};

use kubelet_emulator::KubeletEmulator;

use crate::harness::*;

/// Measures this row's figures into `table`.
pub fn run(b: &Bench, table: &mut Table) {
    let quick = b.quick;
    let tmp = &b.tmp;
    let client_rt = &b.client_rt;
    let bin_path = daemon_binary();
    let bin = bin_path.as_str();
    let lib = fake_nvml();
    let secs = if quick { 3 } else { 10 };
    let mut p99 = Vec::new();
    for delay_ms in [0u64, 400] {
        let dir = tmp.path().join(format!("slow-nvml-{delay_ms}"));
        std::fs::create_dir_all(dir.join("policy")).unwrap();
        std::fs::write(dir.join("policy/config.yaml"), ts_policy(4)).unwrap();
        let inventory = dir.join("nvml.json");
        std::fs::write(&inventory, fake_nvml_inventory(8, delay_ms)).unwrap();
        let plugins = dir.join("plugins");
        let emu = client_rt
            .block_on(KubeletEmulator::start(&plugins))
            .unwrap();
        let mut child = std::process::Command::new(bin)
            .args(["run", "--config"])
            .arg(dir.join("policy/config.yaml"))
            .arg("--device-plugin-path")
            .arg(&plugins)
            .arg("--nvml-library")
            .arg(&lib)
            .env("FAKE_NVML_INVENTORY", &inventory)
            .env("SLICELET_LOG", "error")
            .env("SLICELET_STATUS_ADDRESS", "")
            .spawn()
            .unwrap();
        let ids = shared_ids(client_rt, &emu);
        let client = client_rt
            .block_on(emu.client("nvidia.com/gpu-shared"))
            .unwrap();
        let pid = child.id().to_string();
        let stop = Arc::new(std::sync::atomic::AtomicBool::new(false));
        let hup = {
            let stop = Arc::clone(&stop);
            let pid = pid.clone();
            std::thread::spawn(move || {
                let mut sent = 0u32;
                while !stop.load(Ordering::Relaxed) {
                    let _ = std::process::Command::new("kill")
                        .args(["-HUP", &pid])
                        .status();
                    sent += 1;
                    std::thread::sleep(Duration::from_millis(200));
                }
                sent
            })
        };
        let mut h = hist();
        let until = Instant::now() + Duration::from_secs(secs);
        client_rt.block_on(async {
            while Instant::now() < until {
                allocate_round(&client, &ids, 1, 200, &mut h).await;
            }
        });
        stop.store(true, Ordering::Relaxed);
        let hups = hup.join().unwrap();
        let _ = std::process::Command::new("kill")
            .args(["-TERM", &pid])
            .status();
        let _ = child.wait();
        table.row(
            format!("7. Allocate, NVML memory query +{delay_ms} ms, {hups} SIGHUPs"),
            format!(
                "p50 {:.1} us, p99 {:.1} us ({} calls)",
                us(h.value_at_quantile(0.5)),
                us(h.value_at_quantile(0.99)),
                h.len()
            ),
            "",
            None,
        );
        p99.push(h.value_at_quantile(0.99));
    }
    let ratio = p99[1] as f64 / p99[0] as f64;
    table.row(
        "7. Allocate p99, slow NVML / normal NVML",
        format!("{ratio:.2}"),
        "<= 2",
        Some(ratio <= 2.0),
    );
}
