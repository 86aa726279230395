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
# The binary exactly as `cargo build --release` makes it (the release profile keeps the symbol
# table, so callgrind can name the functions): built on its own, because building it together
# with an example would compile its dependencies with the dev-dependencies' features, and every
# symbol name would differ from the shipped build's.
cargo build --release --locked --bin slicelet
cp "${CARGO_TARGET_DIR:-target}/release/slicelet" "$out/slicelet"
cargo build --release --locked --example profile_workload
"${CARGO_TARGET_DIR:-target}/release/examples/profile_workload" \
  valgrind --tool=callgrind --demangle=no --callgrind-out-file="$out/callgrind.out" \
  "$out/slicelet" > "$out/workload.log" 2>&1 || { cat "$out/workload.log"; exit 1; }
python3 - "$out/callgrind.out" > link/symbol-order.txt <<'PY'
import re, sys
# callgrind's compressed names: "ob=(3) /path", "fn=(12) _RNv…"; a later "fn=(12)" reuses it.
objects, functions, current, seen = {}, {}, None, []
for line in open(sys.argv[1], errors="replace"):
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
    elif current.endswith("/slicelet"):
        seen.append(functions[ident])
print("\n".join(dict.fromkeys(seen)))
PY
echo "link/symbol-order.txt: $(wc -l < link/symbol-order.txt) functions"
