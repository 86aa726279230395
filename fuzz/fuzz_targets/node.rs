//! The simulated-node parser on arbitrary bytes: it must never panic, and whatever it accepts
//! stays within the bounds (64 GPUs, 7 MIG devices each) and has valid UUIDs.
#![no_main]

use libfuzzer_sys::fuzz_target;
use slicelet::inventory::simulated;

fuzz_target!(|data: &[u8]| {
    let Ok(text) = std::str::from_utf8(data) else {
        return;
    };
    if let Ok(inv) = simulated::parse(std::path::Path::new("fuzz.yaml"), text) {
        assert!(inv.gpus.len() <= simulated::MAX_GPUS as usize);
        for g in &inv.gpus {
            assert!(slicelet::uuid::Uuid::parse(&g.uuid).is_ok(), "{}", g.uuid);
            assert!(g.mig_devices.len() <= simulated::MAX_MIG_DEVICES as usize);
        }
    }
});
