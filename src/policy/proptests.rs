//! Property test: random policies, valid and mutated, through parse → validate → plan never
//! panic, and every rejection names a field path.

use proptest::prelude::*;

use super::parse;
use crate::inventory::test_node;
use crate::plan;

fn scalar() -> impl Strategy<Value = String> {
    prop_oneof![
        Just("0".to_string()),
        Just("-1".to_string()),
        Just("4".to_string()),
        Just("4.5".to_string()),
        Just("\"4\"".to_string()),
        Just("all".to_string()),
        Just("null".to_string()),
        Just("[]".to_string()),
        Just("{}".to_string()),
        Just("[0, 1]".to_string()),
        Just("nvidia.com/gpu".to_string()),
        Just("kubernetes.io/x".to_string()),
        Just("99999999999999999999".to_string()),
        "[a-z./:-]{0,12}",
    ]
}

prop_compose! {
    fn entry()(name in prop_oneof![Just("nvidia.com/gpu"), Just("gpu"), Just("nvidia.com/mig-1g.10gb")],
               rename in proptest::option::of("[a-z]{1,8}"),
               devices in proptest::option::of(prop_oneof![Just("all".to_string()), (1u32..10).prop_map(|n| n.to_string()), proptest::collection::vec(0u32..10, 1..4).prop_map(|v| format!("{v:?}"))]),
               replicas in 1u32..64) -> String {
        let mut s = format!("      - name: {name}\n");
        if let Some(r) = rename { s.push_str(&format!("        rename: {r}\n")); }
        if let Some(d) = devices { s.push_str(&format!("        devices: {d}\n")); }
        s.push_str(&format!("        replicas: {replicas}\n"));
        s
    }
}

prop_compose! {
    fn policy()(strategy in prop_oneof![Just("none"), Just("single"), Just("mixed")],
                fail in any::<bool>(),
                rbd in any::<bool>(),
                entries in proptest::collection::vec(entry(), 0..4)) -> String {
        format!("version: v1\nflags:\n  migStrategy: {strategy}\nsharing:\n  timeSlicing:\n    renameByDefault: {rbd}\n    failRequestsGreaterThanOne: {fail}\n    resources:\n{}", entries.concat())
    }
}

prop_compose! {
    fn mps_policy()(ts in policy(),
                    entries in proptest::collection::vec((entry(), proptest::option::of(0u32..120), proptest::option::of(prop_oneof![Just("10Gi"), Just("20000Mi"), Just("1.5Gi"), Just("8G"), Just("0"), Just("-1Gi"), Just("99999Ti")])), 0..3),
                    exclusive in any::<bool>(),
                    fail in proptest::option::of(any::<bool>())) -> String {
        let mut s = format!("{ts}  mps:\n    exclusiveProcess: {exclusive}\n");
        if let Some(f) = fail { s.push_str(&format!("    failRequestsGreaterThanOne: {f}\n")); }
        s.push_str("    resources:\n");
        for (e, pct, mem) in entries {
            s.push_str(&e);
            if let Some(p) = pct { s.push_str(&format!("        activeThreadPercentage: {p}\n")); }
            if let Some(m) = mem { s.push_str(&format!("        pinnedDeviceMemoryLimit: {m}\n")); }
        }
        s
    }
}

fn mutate(text: &str, line: usize, how: u8, value: &str) -> String {
    let mut lines: Vec<String> = text.lines().map(str::to_string).collect();
    let i = line % lines.len().max(1);
    match how % 4 {
        // Replace a value.
        0 => {
            if let Some((k, _)) = lines[i].split_once(':') {
                lines[i] = format!("{k}: {value}");
            }
        }
        // Rename a key (typo or misplaced key).
        1 => lines[i] = lines[i].replacen(':', "x:", 1),
        // Drop a line.
        2 => {
            lines.remove(i);
        }
        // Duplicate a line at another depth.
        _ => {
            let l = format!("  {}", lines[i]);
            lines.insert(i, l);
        }
    }
    lines.join("\n") + "\n"
}

fn check(text: &str) {
    match parse(text) {
        Err(e) => {
            assert!(!e.path.is_empty(), "error without a path for:\n{text}\n{e}");
            assert!(!e.message.is_empty());
        }
        Ok(p) => {
            for gpus in [0, 1, 8] {
                if let Err(e) = plan::build(&p, &test_node(gpus)) {
                    assert!(!e.to_string().is_empty());
                }
            }
        }
    }
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 256, ..ProptestConfig::default() })]

    #[test]
    fn valid_policies_never_panic(text in policy()) {
        check(&text);
    }

    #[test]
    fn mutated_policies_never_panic_and_errors_have_paths(text in policy(), line in 0usize..40, how in any::<u8>(), value in scalar()) {
        check(&mutate(&text, line, how, &value));
    }

    #[test]
    fn mps_policies_never_panic_and_errors_have_paths(text in mps_policy(), line in 0usize..60, how in any::<u8>(), value in scalar()) {
        check(&text);
        check(&mutate(&text, line, how, &value));
    }

    #[test]
    fn arbitrary_text_never_panics(text in "\\PC{0,200}") {
        check(&text);
    }
}
