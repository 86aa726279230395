//! NVIDIA's MIG profile tables for the GPUs a simulated node (and the fake NVML of the tests)
//! can stand for: each GPU instance profile with NVML's numbers for it, and the placements the
//! driver allows it.
//!
//! Pure data with no path into the rest of the crate: `fixtures/fake-nvml` includes this file
//! as a module of its own, so the fake driver and the simulated node place instances by one
//! table. A real node never reads it: NVML answers the same questions
//! (`nvmlDeviceGetGpuInstanceProfileInfo`, `nvmlDeviceGetGpuInstancePossiblePlacements_v2`).
//!
//! Sources: NVIDIA's MIG user guide ("Supported MIG Profiles", one table per product, and the
//! placement diagrams), NVML's `nvml.h` for the profile indices
//! (`NVML_GPU_INSTANCE_PROFILE_*`, `NVML_COMPUTE_INSTANCE_PROFILE_*`).
//!
//! Units: a placement's `start` and `size` count **memory slices** (8 on the A100, H100 and
//! H200, 4 on the A30), as NVML's `nvmlGpuInstancePlacement_t` does; `gpu_slices` counts
//! compute slices (7, or 4 on the A30); `memory_mib` is what NVML's `memorySizeMB` reports
//! (MiB, despite the name). Every row's memory gives back its name's GB under NVIDIA's rounding
//! rule ([`super::memory_gb`]; a test checks it).

/// One GPU instance profile of one product.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct ProfileRow {
    /// The profile as NVIDIA names it: `1g.10gb`, `1g.10gb+me`.
    pub name: &'static str,
    /// NVML's profile index, the `profile` argument of `nvmlDeviceGetGpuInstanceProfileInfo`
    /// (`NVML_GPU_INSTANCE_PROFILE_1_SLICE` = 0, …, `_1_SLICE_REV1` = 7 for `+me`,
    /// `_2_SLICE_REV1` = 8, `_1_SLICE_REV2` = 9 for the double-memory one-slice profile).
    pub nvml_profile: u32,
    /// The profile id NVML reports in `nvmlGpuInstanceProfileInfo_t.id` (what `nvidia-smi mig
    /// -lgip` lists: 19 for `1g.10gb` on an H100) and takes in the placement and create calls.
    pub id: u32,
    /// Compute slices of the GPU instance (`sliceCount`): the `g` of the name.
    pub gpu_slices: u32,
    /// Memory of the instance, MiB (`memorySizeMB`).
    pub memory_mib: u64,
    /// At most this many instances of the profile at once (`instanceCount`).
    pub instance_count: u32,
    /// The placements' first memory slices, ascending.
    pub starts: &'static [u32],
    /// Memory slices every placement of the profile covers.
    pub size: u32,
}

/// One product's MIG geometry.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct GpuTable {
    /// The product as NVML names it (`nvmlDeviceGetName`) on the reference board.
    pub product: &'static str,
    /// Memory slices of the whole GPU (8, or 4 on the A30).
    pub memory_slices: u32,
    /// Compute slices of the whole GPU (7, or 4 on the A30).
    pub compute_slices: u32,
    /// Its GPU instance profiles, NVML profile index ascending.
    pub profiles: &'static [ProfileRow],
}

/// The compute instance profile index (`NVML_COMPUTE_INSTANCE_PROFILE_*`) of a compute
/// instance that spans all `gpu_slices` of its GPU instance: 1 → 0, 2 → 1, 3 → 2, 4 → 3,
/// 7 → 4, 8 → 5, 6 → 6 (`nvml.h`). `None` for a slice count NVML has no profile for.
pub fn full_compute_profile(gpu_slices: u32) -> Option<u32> {
    match gpu_slices {
        1 => Some(0),
        2 => Some(1),
        3 => Some(2),
        4 => Some(3),
        7 => Some(4),
        8 => Some(5),
        6 => Some(6),
        _ => None,
    }
}

const EIGHT_SLICE_STARTS_1: &[u32] = &[0, 1, 2, 3, 4, 5, 6];
const EIGHT_SLICE_STARTS_2: &[u32] = &[0, 2, 4, 6];
const EIGHT_SLICE_STARTS_2G: &[u32] = &[0, 2, 4];
const EIGHT_SLICE_STARTS_3G: &[u32] = &[0, 4];
const ONLY_START_0: &[u32] = &[0];

/// The seven profiles of an eight-memory-slice GPU (A100, H100, H200), from the smallest one
/// (`one` MiB), the double-memory one-slice and two-slice ones (`two`), the three- and
/// four-slice ones (`four`) and the whole GPU (`all`), with their names.
const fn eight_slice(names: [&'static str; 7], memory: [u64; 4]) -> [ProfileRow; 7] {
    let [one, two, four, all] = memory;
    [
        ProfileRow {
            name: names[0],
            nvml_profile: 0,
            id: 19,
            gpu_slices: 1,
            memory_mib: one,
            instance_count: 7,
            starts: EIGHT_SLICE_STARTS_1,
            size: 1,
        },
        ProfileRow {
            name: names[1],
            nvml_profile: 1,
            id: 14,
            gpu_slices: 2,
            memory_mib: two,
            instance_count: 3,
            starts: EIGHT_SLICE_STARTS_2G,
            size: 2,
        },
        ProfileRow {
            name: names[2],
            nvml_profile: 2,
            id: 9,
            gpu_slices: 3,
            memory_mib: four,
            instance_count: 2,
            starts: EIGHT_SLICE_STARTS_3G,
            size: 4,
        },
        ProfileRow {
            name: names[3],
            nvml_profile: 3,
            id: 5,
            gpu_slices: 4,
            memory_mib: four,
            instance_count: 1,
            starts: ONLY_START_0,
            size: 4,
        },
        ProfileRow {
            name: names[4],
            nvml_profile: 4,
            id: 0,
            gpu_slices: 7,
            memory_mib: all,
            instance_count: 1,
            starts: ONLY_START_0,
            size: 8,
        },
        ProfileRow {
            name: names[5],
            nvml_profile: 7,
            id: 20,
            gpu_slices: 1,
            memory_mib: one,
            instance_count: 1,
            starts: EIGHT_SLICE_STARTS_1,
            size: 1,
        },
        ProfileRow {
            name: names[6],
            nvml_profile: 9,
            id: 15,
            gpu_slices: 1,
            memory_mib: two,
            instance_count: 4,
            starts: EIGHT_SLICE_STARTS_2,
            size: 2,
        },
    ]
}

const A100_40GB: [ProfileRow; 7] = eight_slice(
    [
        "1g.5gb",
        "2g.10gb",
        "3g.20gb",
        "4g.20gb",
        "7g.40gb",
        "1g.5gb+me",
        "1g.10gb",
    ],
    [4864, 9856, 19968, 40192],
);

const A100_80GB: [ProfileRow; 7] = eight_slice(
    [
        "1g.10gb",
        "2g.20gb",
        "3g.40gb",
        "4g.40gb",
        "7g.80gb",
        "1g.10gb+me",
        "1g.20gb",
    ],
    [9728, 19968, 40192, 80384],
);

const H100_80GB: [ProfileRow; 7] = eight_slice(
    [
        "1g.10gb",
        "2g.20gb",
        "3g.40gb",
        "4g.40gb",
        "7g.80gb",
        "1g.10gb+me",
        "1g.20gb",
    ],
    [9856, 19968, 40320, 80896],
);

const H200: [ProfileRow; 7] = eight_slice(
    [
        "1g.18gb",
        "2g.35gb",
        "3g.71gb",
        "4g.71gb",
        "7g.141gb",
        "1g.18gb+me",
        "1g.35gb",
    ],
    [16384, 32512, 65280, 130816],
);

const A30: [ProfileRow; 5] = [
    ProfileRow {
        name: "1g.6gb",
        nvml_profile: 0,
        id: 14,
        gpu_slices: 1,
        memory_mib: 5836,
        instance_count: 4,
        starts: &[0, 1, 2, 3],
        size: 1,
    },
    ProfileRow {
        name: "2g.12gb",
        nvml_profile: 1,
        id: 5,
        gpu_slices: 2,
        memory_mib: 11748,
        instance_count: 2,
        starts: &[0, 2],
        size: 2,
    },
    ProfileRow {
        name: "4g.24gb",
        nvml_profile: 3,
        id: 0,
        gpu_slices: 4,
        memory_mib: 23680,
        instance_count: 1,
        starts: ONLY_START_0,
        size: 4,
    },
    ProfileRow {
        name: "1g.6gb+me",
        nvml_profile: 7,
        id: 21,
        gpu_slices: 1,
        memory_mib: 5836,
        instance_count: 1,
        starts: &[0, 1, 2, 3],
        size: 1,
    },
    ProfileRow {
        name: "2g.12gb+me",
        nvml_profile: 8,
        id: 6,
        gpu_slices: 2,
        memory_mib: 11748,
        instance_count: 1,
        starts: &[0, 2],
        size: 2,
    },
];

/// Every product with a table, with its total memory (MiB, as NVML reports it on the
/// reference board; `fixtures/models/gpu-models.yaml` agrees).
pub const TABLES: &[(GpuTable, u64)] = &[
    (
        GpuTable {
            product: "NVIDIA A100-SXM4-40GB",
            memory_slices: 8,
            compute_slices: 7,
            profiles: &A100_40GB,
        },
        40960,
    ),
    (
        GpuTable {
            product: "NVIDIA A100-SXM4-80GB",
            memory_slices: 8,
            compute_slices: 7,
            profiles: &A100_80GB,
        },
        81920,
    ),
    (
        GpuTable {
            product: "NVIDIA H100 80GB HBM3",
            memory_slices: 8,
            compute_slices: 7,
            profiles: &H100_80GB,
        },
        81559,
    ),
    (
        GpuTable {
            product: "NVIDIA H200",
            memory_slices: 8,
            compute_slices: 7,
            profiles: &H200,
        },
        143771,
    ),
    (
        GpuTable {
            product: "NVIDIA A30",
            memory_slices: 4,
            compute_slices: 4,
            profiles: &A30,
        },
        24576,
    ),
];

/// The table for a product as NVML names it, matched by family: a name with `H200`, `H100`
/// or `A30` in it, or `A100` (the 80GB table when the memory is over 64 GiB, else the 40GB
/// one). `None` for a GPU without MIG or without a table here (an L4, a V100, a B200).
pub fn for_product(product: &str, memory_mib: u64) -> Option<&'static GpuTable> {
    let by_name = |name: &str| TABLES.iter().find(|(t, _)| t.product == name);
    let found = if product.contains("H200") {
        by_name("NVIDIA H200")
    } else if product.contains("H100") {
        by_name("NVIDIA H100 80GB HBM3")
    } else if product.contains("A100") {
        by_name(if memory_mib > 64 * 1024 {
            "NVIDIA A100-SXM4-80GB"
        } else {
            "NVIDIA A100-SXM4-40GB"
        })
    } else if product.contains("A30") {
        by_name("NVIDIA A30")
    } else {
        None
    };
    found.map(|(t, _)| t)
}
