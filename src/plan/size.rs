//! The encoded size of a resource's ListAndWatch message, in closed form, so that a resource
//! over the kubelet's 4 MiB receive limit is refused before any device is allocated.

use super::select::Unit;
use crate::device_health::Health;

pub(super) fn id_len(uuid: &str, replicas: u32, n: u32) -> usize {
    if replicas > 1 {
        uuid.len() + 2 + decimal_len(u64::from(n))
    } else {
        uuid.len()
    }
}

/// Encoded size of the ListAndWatch message for `replicas` devices per unit, bytes, in
/// O(units × digits): replica IDs `<uuid>::<n>` only differ in the digit count of `n`.
pub(super) fn encoded_size(units: &[Unit<'_>], replicas: u32) -> u64 {
    let mut total = 0u64;
    for u in units {
        let device =
            |id_len: usize| framed(device_encoded_len(id_len, u.health(), u.gpu.numa_node));
        if replicas <= 1 {
            total = total.saturating_add(u64::from(replicas) * device(u.uuid().len()));
            continue;
        }
        let mut lo = 0u64;
        let mut hi = 10u64;
        for digits in 1..=10usize {
            let count = u64::from(replicas).min(hi).saturating_sub(lo);
            total = total.saturating_add(count.saturating_mul(device(u.uuid().len() + 2 + digits)));
            lo = hi;
            hi = hi.saturating_mul(10);
        }
    }
    total
}

fn decimal_len(mut n: u64) -> usize {
    let mut len = 1;
    while n >= 10 {
        n /= 10;
        len += 1;
    }
    len
}

/// Bytes of a protobuf varint.
pub(super) fn varint_len(v: u64) -> u64 {
    u64::from((64 - (v | 1).leading_zeros()).div_ceil(7))
}

/// A length-delimited field: tag byte + length varint + payload.
pub(super) fn framed(payload: u64) -> u64 {
    1 + varint_len(payload) + payload
}

/// Encoded size of one `Device` message (without its own framing), bytes. Mirrors protobuf's
/// encoding of `{ID, health, topology{nodes[{ID}]}}`; a test in `plugin` checks it against prost.
pub fn device_encoded_len(id_len: usize, health: Health, numa: Option<i64>) -> u64 {
    let health = health.as_str().len() as u64;
    let mut len = framed(id_len as u64) + framed(health);
    if let Some(n) = numa {
        // NUMANode{ID}: proto3 omits a zero ID; negative int64 takes 10 bytes.
        let numa_len = if n == 0 { 0 } else { 1 + varint_len(n as u64) };
        let topo_len = framed(numa_len);
        len += framed(topo_len);
    }
    len
}
