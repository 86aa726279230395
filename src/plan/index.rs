//! The lookup tables a resource plan precomputes over its devices: device positions by ID
//! ([`IdIndex`]) and the physical units with their pairwise link scores ([`UnitLinks`]).

use std::hash::BuildHasher as _;

use super::VirtualDevice;
use crate::inventory::topology::{Link, SAME_GPU_SCORE};

/// Device positions by ID without a second copy of the IDs: a hash table of positions into
/// the resource's `devices`, hashed and compared through them (2,688 devices used to mean
/// 2,688 cloned ID strings, 16 % of a plan build's allocations). Derived from `devices`, so
/// two indexes over equal device lists are equal.
#[derive(Clone, Default)]
pub(super) struct IdIndex {
    table: hashbrown::HashTable<u32>,
    hasher: hashbrown::DefaultHashBuilder,
}

impl IdIndex {
    pub(super) fn new(devices: &[VirtualDevice]) -> Self {
        let hasher = hashbrown::DefaultHashBuilder::default();
        let mut table = hashbrown::HashTable::with_capacity(devices.len());
        let rehash = |&j: &u32| hasher.hash_one(devices[j as usize].id.as_str());
        for (i, d) in devices.iter().enumerate() {
            let h = hasher.hash_one(d.id.as_str());
            // A repeated ID (never built, but possible in a hand-made plan) points at its
            // last device, as a map collected from the list would.
            match table.entry(h, |&j| devices[j as usize].id == d.id, rehash) {
                hashbrown::hash_table::Entry::Occupied(mut e) => *e.get_mut() = i as u32,
                hashbrown::hash_table::Entry::Vacant(e) => {
                    e.insert(i as u32);
                }
            }
        }
        IdIndex { table, hasher }
    }

    pub(super) fn get(&self, devices: &[VirtualDevice], id: &str) -> Option<usize> {
        let h = self.hasher.hash_one(id);
        self.table
            .find(h, |&j| devices.get(j as usize).is_some_and(|d| d.id == id))
            .map(|&j| j as usize)
    }
}

impl PartialEq for IdIndex {
    /// Always equal: the index is a function of the device list, which `ResourcePlan`
    /// compares itself.
    fn eq(&self, _: &Self) -> bool {
        true
    }
}

impl Eq for IdIndex {}

impl std::fmt::Debug for IdIndex {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "IdIndex({} IDs)", self.table.len())
    }
}

/// The physical units (GPUs or MIG devices) of one resource and their pairwise link scores
/// ([`Link::score`]; two MIG devices of one GPU score [`SAME_GPU_SCORE`]), computed once with
/// the plan so GetPreferredAllocation does no NVML and no rebuild per call.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct UnitLinks {
    /// Per device position: its unit's number (units numbered 0.. in device order).
    pub(super) unit_of: Vec<u32>,
    /// Per unit: the position of its first device.
    pub(super) first: Vec<usize>,
    /// Per unit: the GPU index behind it.
    gpu: Vec<u32>,
    /// Per unit: the NUMA node of its GPU.
    numa: Vec<Option<i64>>,
    /// `n × n` scores, row-major; the diagonal is 0.
    scores: Vec<u32>,
}

impl UnitLinks {
    /// `link(gpu a, numa a, gpu b, numa b)` is the link between two GPUs.
    pub(super) fn new(
        devices: &[VirtualDevice],
        link: impl Fn(u32, Option<i64>, u32, Option<i64>) -> Link,
    ) -> Self {
        let mut links = Self::units(devices);
        links.compute_scores(link);
        links
    }

    /// The units of `devices`, with no scores yet.
    fn units(devices: &[VirtualDevice]) -> Self {
        let mut unit_of = Vec::with_capacity(devices.len());
        let mut first: Vec<usize> = Vec::new();
        let mut gpu = Vec::new();
        let mut numa = Vec::new();
        // Devices come grouped by unit (GPU, MIG, replica order): compare with the last unit
        // instead of hashing every device's UUID (that hashing was 15 % of a 2,688-device plan
        // build); a unit seen before out of order is still found.
        let mut last: Option<(&str, u32)> = None;
        for (p, d) in devices.iter().enumerate() {
            let u = match last {
                Some((uuid, u)) if uuid == d.gpu_uuid => u,
                _ => {
                    let u = match first
                        .iter()
                        .position(|&f| devices[f].gpu_uuid == d.gpu_uuid)
                    {
                        Some(i) => i as u32,
                        None => {
                            first.push(p);
                            gpu.push(d.gpu_index);
                            numa.push(d.numa_node);
                            (first.len() - 1) as u32
                        }
                    };
                    last = Some((d.gpu_uuid.as_str(), u));
                    u
                }
            };
            unit_of.push(u);
        }
        UnitLinks {
            unit_of,
            first,
            gpu,
            numa,
            scores: Vec::new(),
        }
    }

    /// (Re)computes the scores between the units.
    pub(super) fn compute_scores(
        &mut self,
        link: impl Fn(u32, Option<i64>, u32, Option<i64>) -> Link,
    ) {
        let (gpu, numa) = (&self.gpu, &self.numa);
        let n = self.first.len();
        // One link lookup per GPU pair, not per unit pair (7 MIG devices per GPU make 49 unit
        // pairs per GPU pair).
        let mut gpus: Vec<(u32, Option<i64>)> =
            gpu.iter().copied().zip(numa.iter().copied()).collect();
        gpus.sort_unstable();
        gpus.dedup_by_key(|g| g.0);
        let g = gpus.len();
        let slot = |index: u32| gpus.binary_search_by_key(&index, |x| x.0).unwrap_or(0);
        let mut by_gpu = vec![SAME_GPU_SCORE; g * g];
        for i in 0..g {
            for j in i + 1..g {
                let s = link(gpus[i].0, gpus[i].1, gpus[j].0, gpus[j].1).score();
                by_gpu[i * g + j] = s;
                by_gpu[j * g + i] = s;
            }
        }
        let slots: Vec<usize> = gpu.iter().map(|&i| slot(i)).collect();
        let mut scores = vec![0; n * n];
        for a in 0..n {
            for b in a + 1..n {
                let s = by_gpu[slots[a] * g + slots[b]];
                scores[a * n + b] = s;
                scores[b * n + a] = s;
            }
        }
        self.scores = scores;
    }

    /// How many units.
    pub fn len(&self) -> usize {
        self.first.len()
    }

    /// Whether the resource has no units.
    pub fn is_empty(&self) -> bool {
        self.first.is_empty()
    }

    /// The unit of the device at `position`.
    pub fn unit_of(&self, position: usize) -> usize {
        self.unit_of[position] as usize
    }

    /// The position of unit `u`'s first device.
    pub fn first(&self, u: usize) -> usize {
        self.first[u]
    }

    /// The NUMA node of unit `u`'s GPU.
    pub fn numa(&self, u: usize) -> Option<i64> {
        self.numa[u]
    }

    /// The link score between units `a` and `b` (0 when `a == b`).
    pub fn score(&self, a: usize, b: usize) -> u32 {
        self.scores[a * self.first.len() + b]
    }
}
