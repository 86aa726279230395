//! The two parsers of what the sampler reads from the host on arbitrary bytes: a process's
//! `/proc/<pid>/cgroup` and the kubelet's device checkpoint. Neither may panic; what the cgroup
//! parser accepts has a Kubernetes UID's form and a 64-hex-digit container ID, and the
//! checkpoint's device IDs come out sorted and without duplicates.
#![no_main]

use libfuzzer_sys::fuzz_target;
use slicelet::usage::{cgroup, checkpoint};

fuzz_target!(|data: &[u8]| {
    let Ok(text) = std::str::from_utf8(data) else {
        return;
    };
    if let Some(pod) = cgroup::parse(text) {
        assert_eq!(pod.pod_uid.len(), 36, "{}", pod.pod_uid);
        assert!(pod
            .pod_uid
            .bytes()
            .all(|b| b == b'-' || b.is_ascii_digit() || (b'a'..=b'f').contains(&b)));
        if let Some(id) = &pod.container_id {
            assert_eq!(id.len(), 64, "{id}");
        }
    }
    if let Ok(entries) = checkpoint::parse(std::path::Path::new("fuzz"), text) {
        for e in entries {
            assert!(e.device_ids.windows(2).all(|w| w[0] < w[1]), "{:?}", e.device_ids);
        }
    }
});
