//! The policy parser on arbitrary bytes, through the same checks the daemon applies before
//! parsing (UTF-8, nesting depth): it must never panic.
#![no_main]

use libfuzzer_sys::fuzz_target;
use slicelet::policy;

fuzz_target!(|data: &[u8]| {
    if data.len() as u64 > policy::DEFAULT_MAX_BYTES {
        return;
    }
    let Ok(text) = std::str::from_utf8(data) else {
        return;
    };
    if policy::check_nesting(text, &policy::Limits::default()).is_err() {
        return;
    }
    let _ = policy::parse(text);
});
