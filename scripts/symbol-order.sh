#!/usr/bin/env bash
# Regenerates link/symbol-order.txt: the functions the `slicelet` binary executes through an
# idle daemon's life (start, registration, ListAndWatch, Allocate, GetPreferredAllocation, a
# policy reload, a node label change, /readyz, /metrics, SIGTERM), in first-executed order, as
# valgrind's callgrind records them while examples/profile_workload.rs drives the binary.
# build.rs hands the list to the linker (LLD's --symbol-ordering-file), which places those
# functions first and together: the idle daemon's resident code then stays small however much
# unused code (the Kubernetes client, TLS) the binary carries. Run it after changes that add
# code to the hot path; a stale list only costs resident memory, never correctness.
# Needs valgrind (Debian: apt-get install valgrind). Takes about a minute.
set -euo pipefail
cd "$(dirname "$0")/.."
out=$(mktemp -d)
trap 'rm -rf "$out"' EXIT
target="${CARGO_TARGET_DIR:-target}"
# The workload driver (its own build: building it together with the binary would compile the
# binary's dependencies with the dev-dependencies' features, and every name would differ).
cargo build --release --locked --example profile_workload
cp "$target/release/examples/profile_workload" "$out/workload"
# The binary exactly as `cargo build --release` makes it (the release profile keeps the symbol
# table, so callgrind can name its functions), and as `cargo bench` makes it (the bench
# profile's name is part of every symbol's hash): one list with both sets of names, each
# binary finds its own.
for profile in release bench; do
  # Both profiles write target/release/slicelet: each gets a target directory of its own
  # (symbol names do not depend on it).
  CARGO_TARGET_DIR="$target/symbol-order-$profile" cargo build --profile "$profile" --locked --bin slicelet
  cp "$target/symbol-order-$profile/release/slicelet" "$out/slicelet-$profile"
  "$out/workload" valgrind --tool=callgrind --demangle=no \
    --callgrind-out-file="$out/callgrind-$profile.out" "$out/slicelet-$profile" \
    > "$out/workload-$profile.log" 2>&1 || { cat "$out/workload-$profile.log"; exit 1; }
done
python3 - "$out/callgrind-release.out" "$out/callgrind-bench.out" > link/symbol-order.txt <<'PY'
import re, sys
seen = []
for path in sys.argv[1:]:
    # callgrind's compressed names: "ob=(3) /path", "fn=(12) _ZN…"; a later "fn=(12)" reuses it.
    objects, functions, current = {}, {}, ""
    for line in open(path, errors="replace"):
        m = re.match(r"^(c?)(ob|fn)=\((\d+)\)(?: (.*))?$", line.rstrip("\n"))
        if not m:
            continue
        callee, kind, ident, name = m.groups()
        table = objects if kind == "ob" else functions
        if name:
            table[ident] = name
        if callee:
            continue
        if kind == "ob":
            current = objects.get(ident, "")
        elif "/slicelet-" in current:
            seen.append(functions[ident])
print("\n".join(dict.fromkeys(seen)))
PY
echo "link/symbol-order.txt: $(wc -l < link/symbol-order.txt) functions"
