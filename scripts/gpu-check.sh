#!/usr/bin/env bash
# Checks on a real GPU, each skipped on its own with one line when the machine cannot run it.
# Run by a person, as root, on a machine with an NVIDIA GPU; CI does not run it (it has no GPU).
#
#   scripts/gpu-check.sh [SLICELET_BINARY]
#
# Without SLICELET_BINARY it builds target/release/slicelet (cargo build --release --locked).
#
# 1. GPU memory limits per container (docs/memory-limits.md), on GPU 0 with MIG mode off,
#    driver R615 or later and cgroup v2. It writes a policy giving GPU 0 two sizes, a 10 GiB
#    and a 20 GiB hard limit (two entries, two resource names), has `slicelet plan` (NVML)
#    confirm both are enforced, creates two cgroups (<root>/slicelet-check/a and b) and runs
#    `slicelet hook set-memory-limits` for each exactly as a container runtime runs the
#    createContainer hook of slicelet's CDI spec: the OCI state on stdin, naming a bundle whose
#    config.json has linux.cgroupsPath. It prints NVML's readback of both limits
#    (nvmlDeviceGetMemoryLimits_v1), then, from a process in each cgroup, allocates GPU memory
#    through the CUDA driver API (ctypes on libcuda.so.1, no toolkit needed): in a, 11 GiB must
#    fail with CUDA_ERROR_OUT_OF_MEMORY and 9 GiB succeed; in b, 19 GiB must succeed and 21 GiB
#    fail. It removes the cgroups (the driver drops their limits) and its files.
# 2. Dynamic MIG's create and destroy (docs/mig.md), on the first GPU with MIG mode on: it
#    creates the smallest free instance (the first `1g.*` profile `nvidia-smi mig -lgip` shows
#    with an instance free; GPU_CHECK_MIG_PROFILE names another) through slicelet's own NVML
#    code (`slicelet mig create`), checks its UUID is in `nvidia-smi -L`, destroys it
#    (`slicelet mig destroy`) and checks it is gone. It never changes MIG mode; an instance it
#    leaves after a failure is destroyed on exit.
#
# Needs python3 (ctypes) and the driver's libnvidia-ml.so.1 and libcuda.so.1; part 2 needs
# nvidia-smi. SLICELET_NVML_LIBRARY (slicelet's own variable) names another NVML library;
# SLICELET_HOOK_CGROUP_ROOT (the hook's) another cgroup v2 mount than /sys/fs/cgroup.
#
# Exit 0: every check held, or was skipped with one line saying why (no NVIDIA driver or GPU;
# part 1: GPU 0 in MIG mode, a driver before R615, no cgroup v2; part 2: no GPU in MIG mode).
# Exit 1: a check failed, or the machine cannot run it (not root, no python3, GPU 0 too small
# or busy, no free MIG instance), with the reason.
set -euo pipefail

repo=$(cd "$(dirname "$0")/.." && pwd)
cgroot=${SLICELET_HOOK_CGROUP_ROOT:-/sys/fs/cgroup}
parent=$cgroot/slicelet-check

say() { echo "gpu-check: $*"; }
skip() {
  say "skipped: $*"
  exit 0
}
# One part skipped: the caller returns.
skip_part() { say "$1: skipped: $2"; }
fail() {
  echo "gpu-check: FAILED: $*" >&2
  exit 1
}

command -v python3 >/dev/null || fail "python3 is needed (NVML and CUDA are called through ctypes)"

work=$(mktemp -d)
bin=
made_mig=
cleanup() {
  local d
  if [[ -n $made_mig && -n $bin ]]; then
    "$bin" mig destroy --uuid "$made_mig" >/dev/null ||
      echo "gpu-check: could not destroy $made_mig (nvidia-smi mig -dci / -dgi removes it)" >&2
  fi
  for d in "$parent/a" "$parent/b" "$parent"; do
    [[ -d $d ]] || continue
    # The probes have exited; the kernel may take a moment to see the cgroup empty.
    for _ in $(seq 50); do rmdir "$d" 2>/dev/null && break; sleep 0.1; done
    [[ -d $d ]] && echo "gpu-check: could not remove $d (processes left in it?)" >&2
  done
  rm -rf "$work"
}
trap cleanup EXIT

# NVML and CUDA through ctypes: `info` (one line about GPU 0, or exit 3 with why to skip),
# `readback UUID CGROUP` (the limits NVML reads back), `probe UUID CGROUP KIND:GIB...`
# (allocations from this process, KIND `ok` or `oom`).
cat >"$work/gpu.py" <<'PY'
import ctypes
import os
import sys

MIB = 1024 * 1024
NVML = os.environ.get("SLICELET_NVML_LIBRARY") or "libnvidia-ml.so.1"


class GetLimits(ctypes.Structure):
    # nvmlGetMemoryLimits_v1_t
    _fields_ = [("nameSpace", ctypes.c_char_p), ("softLimit", ctypes.c_ulonglong),
                ("hardLimit", ctypes.c_ulonglong), ("currentUsed", ctypes.c_ulonglong)]


class MemoryInfo(ctypes.Structure):
    # nvmlMemory_t
    _fields_ = [("total", ctypes.c_ulonglong), ("free", ctypes.c_ulonglong), ("used", ctypes.c_ulonglong)]


def nvml():
    lib = ctypes.CDLL(NVML)
    lib.nvmlErrorString.restype = ctypes.c_char_p
    rc = lib.nvmlInit_v2()
    if rc:
        raise OSError(f"nvmlInit_v2: {lib.nvmlErrorString(rc).decode()}")
    return lib


def nvml_call(lib, name, *args):
    rc = getattr(lib, name)(*args)
    if rc:
        raise OSError(f"{name}: {lib.nvmlErrorString(rc).decode()} ({rc})")


def handle_by_uuid(lib, uuid):
    h = ctypes.c_void_p()
    nvml_call(lib, "nvmlDeviceGetHandleByUUID", uuid.encode(), ctypes.byref(h))
    return h


def limits(lib, handle, cgroup):
    g = GetLimits(cgroup.encode(), 0, 0, 0)
    nvml_call(lib, "nvmlDeviceGetMemoryLimits_v1", handle, ctypes.byref(g))
    return g


def info():
    try:
        lib = nvml()
    except OSError as e:
        print(f"no NVIDIA driver or GPU here: {e}")
        return 3
    buf = ctypes.create_string_buffer(96)
    nvml_call(lib, "nvmlSystemGetDriverVersion", buf, 96)
    driver = buf.value.decode()
    count = ctypes.c_uint()
    nvml_call(lib, "nvmlDeviceGetCount_v2", ctypes.byref(count))
    if count.value == 0:
        print(f"no GPU (driver {driver})")
        return 3
    h = ctypes.c_void_p()
    nvml_call(lib, "nvmlDeviceGetHandleByIndex_v2", 0, ctypes.byref(h))
    nvml_call(lib, "nvmlDeviceGetUUID", h, buf, 96)
    uuid = buf.value.decode()
    nvml_call(lib, "nvmlDeviceGetName", h, buf, 96)
    name = buf.value.decode()
    mem = MemoryInfo()
    nvml_call(lib, "nvmlDeviceGetMemoryInfo", h, ctypes.byref(mem))
    current, pending = ctypes.c_uint(), ctypes.c_uint()
    mig = 1 if lib.nvmlDeviceGetMigMode(h, ctypes.byref(current), ctypes.byref(pending)) == 0 and current.value else 0
    print("\t".join([driver, uuid, name, str(mem.total // MIB), str(mem.free // MIB), str(mig)]))
    return 0


def migs():
    # "<index>\t<uuid>" of each GPU whose current MIG mode is on.
    lib = nvml()
    count = ctypes.c_uint()
    nvml_call(lib, "nvmlDeviceGetCount_v2", ctypes.byref(count))
    buf = ctypes.create_string_buffer(96)
    for i in range(count.value):
        h = ctypes.c_void_p()
        nvml_call(lib, "nvmlDeviceGetHandleByIndex_v2", i, ctypes.byref(h))
        current, pending = ctypes.c_uint(), ctypes.c_uint()
        if lib.nvmlDeviceGetMigMode(h, ctypes.byref(current), ctypes.byref(pending)) == 0 and current.value:
            nvml_call(lib, "nvmlDeviceGetUUID", h, buf, 96)
            print(f"{i}\t{buf.value.decode()}")
    return 0


def readback(uuid, cgroup):
    lib = nvml()
    g = limits(lib, handle_by_uuid(lib, uuid), cgroup)
    print(f"hard {g.hardLimit // MIB} MiB, soft {g.softLimit // MIB} MiB, used {g.currentUsed // MIB} MiB")
    return 0


def probe(uuid, cgroup, expectations):
    # CUDA_VISIBLE_DEVICES=<uuid> (set by the caller) makes the GPU CUDA device 0.
    cuda = ctypes.CDLL("libcuda.so.1")
    cuda.cuGetErrorName.argtypes = [ctypes.c_int, ctypes.POINTER(ctypes.c_char_p)]
    cuda.cuCtxCreate_v2.argtypes = [ctypes.POINTER(ctypes.c_void_p), ctypes.c_uint, ctypes.c_int]
    cuda.cuMemAlloc_v2.argtypes = [ctypes.POINTER(ctypes.c_uint64), ctypes.c_size_t]
    cuda.cuMemFree_v2.argtypes = [ctypes.c_uint64]
    cuda.cuCtxDestroy_v2.argtypes = [ctypes.c_void_p]

    def name(rc):
        s = ctypes.c_char_p()
        return s.value.decode() if cuda.cuGetErrorName(rc, ctypes.byref(s)) == 0 and s.value else f"CUresult {rc}"

    def must(rc, what):
        if rc:
            print(f"{what}: {name(rc)}")
            sys.exit(2)

    must(cuda.cuInit(0), "cuInit")
    dev = ctypes.c_int()
    must(cuda.cuDeviceGet(ctypes.byref(dev), 0), "cuDeviceGet")
    ctx = ctypes.c_void_p()
    must(cuda.cuCtxCreate_v2(ctypes.byref(ctx), 0, dev), "cuCtxCreate")
    lib = nvml()
    handle = handle_by_uuid(lib, uuid)
    held = True
    for e in expectations:
        kind, size = e.split(":")
        ptr = ctypes.c_uint64()
        rc = cuda.cuMemAlloc_v2(ctypes.byref(ptr), int(size) * 1024 * MIB)
        if rc == 0:
            used = limits(lib, handle, cgroup).currentUsed // MIB
            cuda.cuMemFree_v2(ptr)
            ok = kind == "ok"
            print(f"{size} GiB: allocated (NVML: the cgroup uses {used} MiB)"
                  + ("" if ok else ", but the limit should have refused it"))
        else:
            ok = kind == "oom" and name(rc) == "CUDA_ERROR_OUT_OF_MEMORY"
            print(f"{size} GiB: {name(rc)}" + (", the limit holds" if ok else ", but it should have been allocated"))
        held = held and ok
    cuda.cuCtxDestroy_v2(ctx)
    return 0 if held else 1


if __name__ == "__main__":
    cmd = sys.argv[1]
    try:
        if cmd == "info":
            sys.exit(info())
        if cmd == "migs":
            sys.exit(migs())
        if cmd == "readback":
            sys.exit(readback(sys.argv[2], sys.argv[3]))
        if cmd == "probe":
            sys.exit(probe(sys.argv[2], sys.argv[3], sys.argv[4:]))
    except OSError as e:
        print(e)
        sys.exit(2)
    sys.exit(f"unknown command {cmd}")
PY

rc=0
gpu=$(python3 "$work/gpu.py" info) || rc=$?
if ((rc == 3)); then skip "$gpu"; elif ((rc != 0)); then fail "NVML: $gpu"; fi
IFS=$'\t' read -r driver uuid model total_mib free_mib mig <<<"$gpu"
say "GPU 0: $uuid ($model, $total_mib MiB, $free_mib MiB free), driver $driver"
[[ $(id -u) -eq 0 ]] || fail "run as root: setting limits through NVML, creating cgroups and MIG devices need it"

if [[ $# -ge 1 ]]; then
  bin=$1
else
  say "building slicelet (cargo build --release --locked)"
  (cd "$repo" && cargo build --release --locked)
  bin=${CARGO_TARGET_DIR:-$repo/target}/release/slicelet
  [[ $bin == /* ]] || bin=$repo/$bin
fi
[[ -x $bin ]] || fail "$bin is not an executable"
say "slicelet: $bin ($("$bin" --version))"

# Part 1: GPU memory limits per container, on GPU 0. (The body is not indented: its heredocs
# keep their text as written.)
memory_limits() {
local part="memory limits" major=${driver%%.*}
[[ $major =~ ^[0-9]+$ ]] || major=0
if ((mig != 0)); then
  skip_part "$part" "GPU 0 is in MIG mode (NVML takes no memory limits on MIG devices)"
  return 0
fi
if ((major < 615)); then
  skip_part "$part" "driver $driver is older than R615 (per-cgroup GPU memory limits need R615 or later)"
  return 0
fi
if [[ $(stat -fc %T "$cgroot" 2>/dev/null || true) != cgroup2fs ]]; then
  skip_part "$part" "$cgroot is not a cgroup v2 hierarchy (GPU memory limits need cgroup v2)"
  return 0
fi
say "$part: cgroup v2 at $cgroot"
((total_mib >= 30 * 1024)) || fail "GPU 0 has $total_mib MiB: the two limits (10 + 20 GiB) need 30 GiB"
((free_mib >= 21 * 1024)) || fail "GPU 0 has $free_mib MiB free: the check allocates up to 21 GiB; stop what runs on it"

# GPU 0 shared by size: one 10 GiB and one 20 GiB replica, each its own resource.
cat >"$work/policy.yaml" <<'EOF'
version: v1
flags:
  plugin:
    deviceListStrategy: cdi-cri
sharing:
  timeSlicing:
    resources:
      - name: nvidia.com/gpu
        rename: nvidia.com/gpu-10gb
        devices: [0]
        replicas: 1
        memory: {hard: 10Gi, enforce: required}
      - name: nvidia.com/gpu
        rename: nvidia.com/gpu-20gb
        devices: [0]
        replicas: 1
        memory: {hard: 20Gi, enforce: required}
EOF
"$bin" plan --config "$work/policy.yaml" --output json >"$work/plan.json" ||
  fail "slicelet plan refused the policy on this machine (above)"
# "<resource> <gpu> <hard MiB> <soft MiB> <enforced>" for both sized resources.
plan=$(python3 - "$work/plan.json" <<'PY'
import json
import sys

plan = json.load(open(sys.argv[1]))
for r in plan["resources"]:
    if r["name"] in ("nvidia.com/gpu-10gb", "nvidia.com/gpu-20gb"):
        for d in r["devices"]:
            print(r["name"], d["gpu"], d.get("memoryHardMiB", 0), d.get("memorySoftMiB", 0),
                  str(d.get("memoryEnforced", False)).lower())
PY
)
want="nvidia.com/gpu-10gb $uuid 10240 0 true
nvidia.com/gpu-20gb $uuid 20480 0 true"
[[ $plan == "$want" ]] || fail "slicelet plan says
$plan
not
$want"
say "plan: nvidia.com/gpu-10gb 10240 MiB and nvidia.com/gpu-20gb 20480 MiB hard on GPU 0, enforced"

if [[ -d $parent ]]; then
  rmdir "$parent/a" "$parent/b" 2>/dev/null || true
  rmdir "$parent" || fail "$parent is left from an earlier run and cannot be removed"
fi
mkdir "$parent" "$parent/a" "$parent/b"

# The createContainer hook as the runtime runs it: the OCI state on stdin, the bundle's
# config.json naming the container's cgroup. The arguments are the ones slicelet's CDI spec
# gives the hook for one replica of each resource.
run_hook() {
  local name=$1 hard_mib=$2 bundle=$work/bundle-$1
  mkdir -p "$bundle/rootfs"
  printf '{"ociVersion": "1.0.2", "process": {"args": ["/bin/true"], "cwd": "/"}, "root": {"path": "rootfs"}, "linux": {"cgroupsPath": "/slicelet-check/%s"}}\n' \
    "$name" >"$bundle/config.json"
  printf '{"ociVersion": "1.0.2", "id": "slicelet-check-%s", "status": "creating", "pid": %d, "bundle": "%s", "annotations": {}}\n' \
    "$name" "$$" "$bundle" |
    "$bin" hook set-memory-limits --gpu "$uuid" --hard-mib "$hard_mib" --soft-mib 0 --enforce required ||
    fail "the hook did not set the limit of $parent/$name (above)"
}
run_hook a 10240
run_hook b 20480

for name in a b; do
  read_back=$(python3 "$work/gpu.py" readback "$uuid" "$parent/$name") || fail "NVML readback of $parent/$name: $read_back"
  say "NVML readback, $parent/$name: $read_back"
done
[[ $(python3 "$work/gpu.py" readback "$uuid" "$parent/a") == "hard 10240 MiB, soft 0 MiB, "* ]] ||
  fail "$parent/a does not read back a 10240 MiB hard limit"
[[ $(python3 "$work/gpu.py" readback "$uuid" "$parent/b") == "hard 20480 MiB, soft 0 MiB, "* ]] ||
  fail "$parent/b does not read back a 20480 MiB hard limit"

# Allocations from a process in each cgroup (it moves itself in before CUDA starts).
probe() {
  local name=$1
  shift
  (
    echo "$BASHPID" >"$parent/$name/cgroup.procs"
    CUDA_VISIBLE_DEVICES=$uuid exec python3 "$work/gpu.py" probe "$uuid" "$parent/$name" "$@"
  ) | sed "s|^|gpu-check: $parent/$name: |"
  return "${PIPESTATUS[0]}"
}
failed=0
probe a oom:11 ok:9 || failed=1
probe b ok:19 oom:21 || failed=1
((failed == 0)) || fail "an allocation did not meet its limit (above)"
say "ok: the limits the hook set hold (10 GiB: 11 refused, 9 allocated; 20 GiB: 19 allocated, 21 refused)"
}

# Part 2: dynamic MIG's create and destroy, through slicelet's own NVML code.
dynamic_mig() {
  local part="dynamic MIG" line index gpu_uuid profile out made listed
  line=$(python3 "$work/gpu.py" migs) || fail "NVML: $line"
  line=${line%%$'\n'*}
  if [[ -z $line ]]; then
    skip_part "$part" "no GPU has MIG mode on (slicelet never enables it; nvidia-smi -i N -mig 1 does)"
    return 0
  fi
  command -v nvidia-smi >/dev/null || fail "$part: nvidia-smi is needed (its -L lists the MIG devices)"
  IFS=$'\t' read -r index gpu_uuid <<<"$line"
  profile=${GPU_CHECK_MIG_PROFILE:-}
  if [[ -z $profile ]]; then
    # "|   0  MIG 1g.10gb   19   7/7   9.75   No ...": the first 1g profile with an instance free.
    out=$(nvidia-smi mig -i "$index" -lgip) || fail "$part: nvidia-smi mig -i $index -lgip: $out"
    profile=$(awk '!found && $3 == "MIG" && $4 ~ /^1g\.[0-9]+gb$/ { split($6, n, "/"); if (n[1] > 0) { print $4; found = 1 } }' <<<"$out")
  fi
  [[ -n $profile ]] || fail "$part: GPU $index ($gpu_uuid) has no 1g profile with an instance free (nvidia-smi mig -i $index -lgip); destroy an instance, or name a profile in GPU_CHECK_MIG_PROFILE"
  out=$("$bin" mig create --gpu "$index" --profile "$profile") ||
    fail "$part: slicelet mig create --gpu $index --profile $profile was refused (above)"
  made=${out%% *}
  made_mig=$made
  say "$part: GPU $index ($gpu_uuid): created $out"
  listed=$(nvidia-smi -L) || fail "$part: nvidia-smi -L: $listed"
  grep -qF "$made" <<<"$listed" || fail "$part: $made is not in nvidia-smi -L:
$listed"
  say "$part: nvidia-smi -L lists $made"
  "$bin" mig destroy --uuid "$made" || fail "$part: slicelet mig destroy --uuid $made failed (above)"
  made_mig=
  listed=$(nvidia-smi -L) || fail "$part: nvidia-smi -L: $listed"
  if grep -qF "$made" <<<"$listed"; then
    fail "$part: $made is still in nvidia-smi -L after slicelet mig destroy"
  fi
  say "$part: ok: $profile created on GPU $index and listed by nvidia-smi, destroyed and gone"
}

memory_limits
dynamic_mig
