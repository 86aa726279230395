//! The API server's name rules for a ResourceSlice (`resource.k8s.io/v1`), as
//! `pkg/apis/resource/validation` applies them, with the API server's own messages: the
//! emulator refuses with 422 what a real kube-apiserver refuses, so a name slicelet gets
//! wrong fails the integration tests the way it fails on a cluster (a real 1.36 API server
//! refused `computeSlices` as a counter name while an emulator that checked nothing took it).
//!
//! Checked: `metadata.name` and `spec.driver` (DNS subdomains), `spec.pool.name` (slash-separated
//! DNS subdomains), every device name, counter-set name and counter name (lowercase RFC 1123
//! labels), each device's `consumesCounters[].counterSet` and its counter names (labels), and
//! attribute and capacity names (a C identifier of at most 32 characters, optionally after a
//! DNS-subdomain domain and `/`).

use serde_json::Value;

/// The longest DNS label, characters (RFC 1123).
const LABEL_MAX: usize = 63;
/// The longest DNS subdomain, characters (RFC 1123).
const SUBDOMAIN_MAX: usize = 253;
/// The longest attribute or capacity identifier after its domain, characters.
const ID_MAX: usize = 32;

const LABEL_MSG: &str = "a lowercase RFC 1123 label must consist of lower case alphanumeric characters or '-', and must start and end with an alphanumeric character (e.g. 'my-name',  or '123-abc', regex used for validation is '[a-z0-9]([-a-z0-9]*[a-z0-9])?')";
const SUBDOMAIN_MSG: &str = "a lowercase RFC 1123 subdomain must consist of lower case alphanumeric characters, '-' or '.', and must start and end with an alphanumeric character (e.g. 'example.com', regex used for validation is '[a-z0-9]([-a-z0-9]*[a-z0-9])?(\\.[a-z0-9]([-a-z0-9]*[a-z0-9])?)*')";
const ID_MSG: &str = "a valid C identifier must start with alphabetic character or '_', followed by a string of alphanumeric characters or '_' (e.g. 'my_name',  or 'MY_NAME',  or 'MyName', regex used for validation is '[A-Za-z_][A-Za-z0-9_]*')";

fn is_label(s: &str) -> bool {
    let b = s.as_bytes();
    let inner = |c: &u8| c.is_ascii_lowercase() || c.is_ascii_digit() || *c == b'-';
    let end = |c: &u8| c.is_ascii_lowercase() || c.is_ascii_digit();
    !b.is_empty()
        && b.len() <= LABEL_MAX
        && b.iter().all(inner)
        && end(&b[0])
        && end(&b[b.len() - 1])
}

fn is_subdomain(s: &str) -> bool {
    s.len() <= SUBDOMAIN_MAX && s.split('.').all(is_label)
}

fn is_c_identifier(s: &str) -> bool {
    let mut chars = s.chars();
    chars
        .next()
        .is_some_and(|c| c.is_ascii_alphabetic() || c == '_')
        && chars.all(|c| c.is_ascii_alphanumeric() || c == '_')
}

/// One refusal: the field path and the API server's `Invalid value` text.
fn invalid(path: &str, value: &str, why: &str) -> String {
    format!("{path}: Invalid value: \"{value}\": {why}")
}

/// Refuses `v` at `path` when longer than `max` characters, else when `ok` says no, with the
/// API server's message for each.
fn checked(
    path: &str,
    v: &str,
    max: usize,
    ok: fn(&str) -> bool,
    why: &str,
    errs: &mut Vec<String>,
) {
    if v.len() > max {
        errs.push(invalid(
            path,
            v,
            &format!("must be no more than {max} characters"),
        ));
    } else if !ok(v) {
        errs.push(invalid(path, v, why));
    }
}

fn label(path: &str, v: &str, errs: &mut Vec<String>) {
    checked(path, v, LABEL_MAX, is_label, LABEL_MSG, errs);
}

fn subdomain(path: &str, v: &str, errs: &mut Vec<String>) {
    checked(path, v, SUBDOMAIN_MAX, is_subdomain, SUBDOMAIN_MSG, errs);
}

/// An attribute or capacity name: `[<domain>/]<C identifier>`.
fn qualified(path: &str, v: &str, errs: &mut Vec<String>) {
    let (domain, id) = match v.split_once('/') {
        Some((d, i)) => (Some(d), i),
        None => (None, v),
    };
    if let Some(d) = domain {
        subdomain(path, d, errs);
    }
    // The identifier is checked, the whole name reported.
    if id.len() > ID_MAX {
        errs.push(invalid(
            path,
            v,
            &format!("must be no more than {ID_MAX} characters"),
        ));
    } else if !is_c_identifier(id) {
        errs.push(invalid(path, v, ID_MSG));
    }
}

fn keys(v: &Value) -> impl Iterator<Item = &str> {
    v.as_object()
        .into_iter()
        .flat_map(|m| m.keys().map(String::as_str))
}

fn items(v: &Value) -> impl Iterator<Item = (usize, &Value)> {
    v.as_array().into_iter().flat_map(|a| a.iter().enumerate())
}

/// Checks every name in the ResourceSlice `v`: `Err` with the API server's 422 message
/// (`ResourceSlice.resource.k8s.io "<name>" is invalid: <path>: Invalid value: …`, several
/// joined with `, ` and in brackets as the API server joins them), `Ok` when all are valid.
pub fn slice(v: &Value) -> Result<(), String> {
    let mut errs = Vec::new();
    let name = v["metadata"]["name"].as_str().unwrap_or_default();
    subdomain("metadata.name", name, &mut errs);
    let spec = &v["spec"];
    if let Some(d) = spec["driver"].as_str() {
        subdomain("spec.driver", d, &mut errs);
    }
    if let Some(p) = spec["pool"]["name"].as_str() {
        for part in p.split('/') {
            subdomain("spec.pool.name", part, &mut errs);
        }
    }
    for (i, set) in items(&spec["sharedCounters"]) {
        let at = format!("spec.sharedCounters[{i}]");
        label(
            &format!("{at}.name"),
            set["name"].as_str().unwrap_or_default(),
            &mut errs,
        );
        for c in keys(&set["counters"]) {
            label(&format!("{at}.counters"), c, &mut errs);
        }
    }
    for (i, d) in items(&spec["devices"]) {
        let at = format!("spec.devices[{i}]");
        label(
            &format!("{at}.name"),
            d["name"].as_str().unwrap_or_default(),
            &mut errs,
        );
        for a in keys(&d["attributes"]) {
            qualified(&format!("{at}.attributes"), a, &mut errs);
        }
        for c in keys(&d["capacity"]) {
            qualified(&format!("{at}.capacity"), c, &mut errs);
        }
        for (j, cc) in items(&d["consumesCounters"]) {
            let cat = format!("{at}.consumesCounters[{j}]");
            label(
                &format!("{cat}.counterSet"),
                cc["counterSet"].as_str().unwrap_or_default(),
                &mut errs,
            );
            for c in keys(&cc["counters"]) {
                label(&format!("{cat}.counters"), c, &mut errs);
            }
        }
    }
    match errs.len() {
        0 => Ok(()),
        1 => Err(format!(
            "ResourceSlice.resource.k8s.io \"{name}\" is invalid: {}",
            errs[0]
        )),
        _ => Err(format!(
            "ResourceSlice.resource.k8s.io \"{name}\" is invalid: [{}]",
            errs.join(", ")
        )),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn mig_slice(counter: &str) -> Value {
        json!({
            "metadata": {"name": "node-a-gpu-slicelet-io-0"},
            "spec": {
                "driver": "gpu.slicelet.io",
                "pool": {"name": "node-a"},
                "sharedCounters": [{"name": "gpu-1", "counters": {counter: {"value": "8"}}}],
                "devices": [{"name": "mig-1", "attributes": {"profile": {"string": "1g.10gb"}},
                             "consumesCounters": [{"counterSet": "gpu-1",
                                                   "counters": {counter: {"value": "1"}}}]}],
            }
        })
    }

    #[test]
    fn a_camel_case_counter_is_refused_with_the_api_servers_words() {
        let e = slice(&mig_slice("computeSlices")).unwrap_err();
        assert!(e.starts_with(
            "ResourceSlice.resource.k8s.io \"node-a-gpu-slicelet-io-0\" is invalid: [spec.sharedCounters[0].counters: Invalid value: \"computeSlices\": a lowercase RFC 1123 label"
        ), "{e}");
        assert!(
            e.contains(
                "spec.devices[0].consumesCounters[0].counters: Invalid value: \"computeSlices\""
            ),
            "{e}"
        );
        slice(&mig_slice("compute-slices")).unwrap();
    }

    #[test]
    fn names_follow_their_rules() {
        assert!(is_label("gpu-0") && !is_label("-gpu") && !is_label("Gpu") && !is_label(""));
        assert!(!is_label(&"a".repeat(64)) && is_label(&"a".repeat(63)));
        assert!(is_subdomain("gpu.slicelet.io") && !is_subdomain("gpu..io"));
        let mut errs = Vec::new();
        qualified("a", "resource.kubernetes.io/pcieRoot", &mut errs);
        qualified("a", "cudaComputeCapability", &mut errs);
        assert!(errs.is_empty(), "{errs:?}");
        qualified("a", "compute-slices", &mut errs);
        qualified("a", &"x".repeat(33), &mut errs);
        assert_eq!(errs.len(), 2, "{errs:?}");
    }
}
