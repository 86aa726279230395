#!/usr/bin/env python3
"""The Python half of .ci/release, and the checks of what it writes.

  release.py version               Cargo.toml's version (the one place to bump it)
  release.py versions              fails unless the chart's version and appVersion, and the
                                   kustomize images' newTag, equal Cargo.toml's version, and
                                   the kustomize images name the chart's image.repository
  release.py chart OUT_DIR         the chart packaged by Helm's own packaging (helm-python-sdk,
                                   `helm package`): OUT_DIR/slicelet-<version>.tgz
  release.py sbom OUT_DIR          the CycloneDX SBOM of the release binary's dependencies:
                                   OUT_DIR/slicelet-<version>.cdx.json
  release.py check OUT_DIR [--image REF]
                                   checks every artifact (CI, and the release workflow before
                                   it publishes): SHA256SUMS, the image under runc
                                   (.ci/image --verify), the SBOM against `cargo tree` and
                                   Cargo.lock, the chart rendered from its .tgz; --image: the
                                   reference the chart's default image must be

Needs PyYAML, helm-python-sdk and cyclonedx-python-lib[json-validation] (.ci/release installs
them in a virtual environment). The SBOM lists what `cargo tree -e normal` lists for the
release target: the crates resolved with the release build's features (dev-dependencies and
build-dependencies, and the features only they enable, left out), proc-macros included; each
with its Cargo.lock checksum, licence, description and repository.
"""

from __future__ import annotations

import argparse
import hashlib
import json
import os
import pathlib
import re
import shutil
import subprocess
import sys
import tempfile
import tomllib
import uuid
from collections import defaultdict
from datetime import datetime, timezone

import yaml

REPO = pathlib.Path(__file__).resolve().parent.parent
CHART = REPO / "deployments" / "helm" / "slicelet"
PACKAGE = "slicelet"
# The image is x86_64 only (deployments/image/layout.txt), and so is the SBOM's dependency tree.
TARGET = "x86_64-unknown-linux-gnu"
CRATES_IO = {
    "registry+https://github.com/rust-lang/crates.io-index",
    "sparse+https://index.crates.io/",
}
# The kustomize files whose `images` set slicelet's image.
KUSTOMIZATIONS = [
    REPO / "manifests" / "base" / "kustomization.yaml",
    REPO / "manifests" / "overlays" / "mps" / "kustomization.yaml",
]


class ReleaseError(Exception):
    pass


def version() -> str:
    with open(REPO / "Cargo.toml", "rb") as f:
        return tomllib.load(f)["package"]["version"]


def artifacts(v: str) -> dict[str, str]:
    return {
        "image": f"slicelet-{v}-oci-amd64.tar",
        "chart": f"slicelet-{v}.tgz",
        "sbom": f"slicelet-{v}.cdx.json",
        "sums": "SHA256SUMS",
    }


def check_versions() -> None:
    v = version()
    chart = yaml.safe_load((CHART / "Chart.yaml").read_text())
    values = yaml.safe_load((CHART / "values.yaml").read_text())
    problems = []
    for key in ("version", "appVersion"):
        if str(chart.get(key)) != v:
            problems.append(f"deployments/helm/slicelet/Chart.yaml {key} is {chart.get(key)!r}, "
                            f"Cargo.toml's version is {v!r}")
    repository = values["image"]["repository"]
    for path in KUSTOMIZATIONS:
        rel = path.relative_to(REPO)
        images = [i for i in yaml.safe_load(path.read_text()).get("images", [])
                  if i.get("name") == PACKAGE]
        if not images:
            problems.append(f"{rel} sets no image {PACKAGE}")
        for image in images:
            if str(image.get("newTag")) != v:
                problems.append(f"{rel} newTag is {image.get('newTag')!r}, Cargo.toml's version "
                                f"is {v!r}")
            if image.get("newName") != repository:
                problems.append(f"{rel} newName is {image.get('newName')!r}, the chart's "
                                f"image.repository is {repository!r}")
    if problems:
        raise ReleaseError("versions differ:\n  " + "\n  ".join(problems))
    print(f"ok: version {v} in Cargo.toml, Chart.yaml (version, appVersion) and the kustomize "
          f"images ({repository})")


def commit_time() -> int | None:
    """The checked-out commit's time, for reproducible archives (None outside a git checkout)."""
    try:
        out = subprocess.run(["git", "-C", str(REPO), "log", "-1", "--format=%ct"],
                             check=True, capture_output=True, text=True).stdout.strip()
        return int(out)
    except (OSError, subprocess.CalledProcessError, ValueError):
        return None


def package_chart(out: pathlib.Path) -> pathlib.Path:
    import helm_python as helm

    v = version()
    when = commit_time()
    with tempfile.TemporaryDirectory() as tmp:
        # Helm's packaging takes each file's mtime into the archive: a copy with the commit's
        # time makes the .tgz the same from every checkout of that commit.
        chart = pathlib.Path(tmp) / "slicelet"
        shutil.copytree(CHART, chart)
        if when is not None:
            for p in [chart, *chart.rglob("*")]:
                os.utime(p, (when, when), follow_symlinks=False)
        written = pathlib.Path(helm.package(chart, destination=out))
    want = out / artifacts(v)["chart"]
    if written != want:
        raise ReleaseError(f"helm package wrote {written}, not {want}")
    print(f"ok: {want.name} (helm package)")
    return want


# --- The SBOM.

def cargo(*args: str) -> str:
    return subprocess.run(["cargo", *args], cwd=REPO, check=True, capture_output=True,
                          text=True).stdout


TREE_LINE = re.compile(r"(\d*)(\S+) v(\S+)((?: \([^)]*\))*)")


def tree_lines(prefix: str) -> list[tuple[int, tuple[str, str]]]:
    """`cargo tree -e normal` of the package for the release target: (depth, (name, version))."""
    out = cargo("tree", "--locked", "-p", PACKAGE, "-e", "normal", "--target", TARGET,
                "--prefix", prefix, "--format", "{p}")
    lines = []
    for line in out.splitlines():
        m = TREE_LINE.fullmatch(line)
        if not m:
            raise ReleaseError(f"cargo tree printed {line!r}")
        lines.append((int(m[1] or 0), (m[2], m[3])))
    return lines


def dependency_graph() -> tuple[tuple[str, str], dict[tuple[str, str], set[tuple[str, str]]]]:
    """The root and every crate's direct normal dependencies, as `cargo tree` resolves them."""
    lines = tree_lines("depth")
    root = lines[0][1]
    edges: dict[tuple[str, str], set[tuple[str, str]]] = defaultdict(set)
    path: list[tuple[str, str]] = []
    for depth, key in lines:
        del path[depth:]
        if path:
            edges[path[-1]].add(key)
        edges.setdefault(key, set())
        path.append(key)
    return root, edges


def lock_checksums() -> dict[tuple[str, str], dict]:
    with open(REPO / "Cargo.lock", "rb") as f:
        return {(p["name"], p["version"]): p for p in tomllib.load(f)["package"]}


def spdx(expression: str) -> str:
    # Cargo's old `MIT/Apache-2.0` form is `MIT OR Apache-2.0` in SPDX.
    return " OR ".join(part.strip() for part in expression.split("/"))


def sbom(out: pathlib.Path) -> pathlib.Path:
    from cyclonedx.contrib.license.factories import LicenseFactory
    from cyclonedx.contrib.this.builders import this_component
    from cyclonedx.model import (ExternalReference, ExternalReferenceType, HashAlgorithm,
                                 HashType, XsUri)
    from cyclonedx.model.bom import Bom
    from cyclonedx.model.component import Component, ComponentType
    from cyclonedx.output import make_outputter
    from cyclonedx.schema import OutputFormat, SchemaVersion
    from packageurl import PackageURL

    v = version()
    root, edges = dependency_graph()
    if root != (PACKAGE, v):
        raise ReleaseError(f"cargo tree's root is {root}, not {PACKAGE} {v}")
    metadata = json.loads(cargo("metadata", "--locked", "--format-version", "1",
                                "--filter-platform", TARGET))
    packages = {(p["name"], p["version"]): p for p in metadata["packages"]}
    lock = lock_checksums()
    licenses = LicenseFactory()

    def component(key: tuple[str, str], kind: ComponentType) -> Component:
        p = packages[key]
        refs = [ExternalReference(type=t, url=XsUri(p[field]))
                for field, t in (("repository", ExternalReferenceType.VCS),
                                 ("homepage", ExternalReferenceType.WEBSITE),
                                 ("documentation", ExternalReferenceType.DOCUMENTATION))
                if p.get(field)]
        common = dict(type=kind, name=key[0], version=key[1], description=p.get("description"),
                      licenses=[licenses.make_from_string(spdx(p["license"]))]
                      if p.get("license") else [],
                      external_references=refs)
        if key == root:
            return Component(bom_ref=f"{PACKAGE}@{v}", **common)
        if p.get("source") not in CRATES_IO:
            raise ReleaseError(f"{key[0]} {key[1]} comes from {p.get('source')}, not crates.io: "
                               "teach .ci/release.py its package URL")
        locked = lock.get(key)
        if not locked or not locked.get("checksum"):
            raise ReleaseError(f"{key[0]} {key[1]} has no checksum in Cargo.lock")
        purl = PackageURL(type="cargo", name=key[0], version=key[1])
        return Component(bom_ref=purl.to_string(), purl=purl,
                         hashes=[HashType(alg=HashAlgorithm.SHA_256, content=locked["checksum"])],
                         **common)

    components = {root: component(root, ComponentType.APPLICATION)}
    for key in sorted(edges):
        if key != root:
            components[key] = component(key, ComponentType.LIBRARY)

    lock_digest = hashlib.sha256((REPO / "Cargo.lock").read_bytes()).hexdigest()
    when = commit_time()
    bom = Bom(serial_number=uuid.uuid5(uuid.NAMESPACE_URL, f"slicelet/{v}/{lock_digest}"))
    bom.metadata.component = components[root]
    bom.metadata.tools.components.add(this_component())
    if when is not None:
        bom.metadata.timestamp = datetime.fromtimestamp(when, tz=timezone.utc)
    for key, c in components.items():
        if key != root:
            bom.components.add(c)
    for key, deps in edges.items():
        bom.register_dependency(components[key], [components[d] for d in sorted(deps)])

    # Validated against the CycloneDX schema by `check` (8 s: not twice).
    text = make_outputter(bom, OutputFormat.JSON, SchemaVersion.V1_6).output_as_string(indent=2)
    path = out / artifacts(v)["sbom"]
    path.write_text(text + "\n")
    print(f"ok: {path.name} (CycloneDX 1.6, {len(components) - 1} crates)")
    return path


# --- The checks.

def check(out: pathlib.Path, image: str | None) -> None:
    v = version()
    names = artifacts(v)
    failures: list[str] = []

    def expect(ok: bool, what: str) -> None:
        if not ok:
            failures.append(what)

    present = sorted(p.name for p in out.iterdir())
    expect(present == sorted(names.values()),
           f"{out} holds {present}, not {sorted(names.values())}")

    # SHA256SUMS: one line per artifact, each verifying.
    sums = (out / names["sums"]).read_text().splitlines()
    listed = sorted(line.split(None, 1)[1].lstrip("*") for line in sums if line.strip())
    expect(listed == sorted(n for k, n in names.items() if k != "sums"),
           f"SHA256SUMS lists {listed}")
    verified = subprocess.run(["sha256sum", "--check", "--strict", names["sums"]], cwd=out,
                              capture_output=True, text=True)
    expect(verified.returncode == 0, f"sha256sum --check: {verified.stdout}{verified.stderr}")
    print(f"{'ok' if verified.returncode == 0 else 'FAILED'}: SHA256SUMS verifies "
          f"({len(listed)} files)")

    failures_before = len(failures)
    check_sbom(out / names["sbom"], v, expect)
    print(f"{'ok' if len(failures) == failures_before else 'FAILED'}: {names['sbom']}")

    failures_before = len(failures)
    check_chart(out / names["chart"], v, image, expect)
    print(f"{'ok' if len(failures) == failures_before else 'FAILED'}: {names['chart']}")

    # The image: unpacked, its tree and config checked, run with runc (as .ci/image does).
    with tempfile.TemporaryDirectory() as work:
        cmd = [str(REPO / ".ci" / "image"), "--verify", str(out / names["image"]), work]
        if os.geteuid() != 0:
            cmd = ["sudo", *cmd]
        ran = subprocess.run(cmd)
        expect(ran.returncode == 0, f"{names['image']}: .ci/image --verify failed")

    if failures:
        raise ReleaseError("release artifacts:\n  " + "\n  ".join(failures))
    print(f"ok: every release artifact of {v} in {out}")


def check_sbom(path: pathlib.Path, v: str, expect) -> None:
    from cyclonedx.schema import SchemaVersion
    from cyclonedx.validation.json import JsonStrictValidator

    text = path.read_text()
    error = JsonStrictValidator(SchemaVersion.V1_6).validate_str(text)
    expect(error is None, f"{path.name}: not valid CycloneDX 1.6: {error}")
    bom = json.loads(text)
    meta = bom.get("metadata", {}).get("component", {})
    expect((meta.get("name"), meta.get("version")) == (PACKAGE, v),
           f"{path.name}: metadata.component is {meta.get('name')} {meta.get('version')}")

    # Every crate `cargo tree -e normal --prefix none` lists, no other, each at its version: its
    # own command line, not the generator's (so that a change there cannot pass unseen).
    tree = set()
    for line in cargo("tree", "--locked", "-p", PACKAGE, "-e", "normal", "--target", TARGET,
                      "--prefix", "none").splitlines():
        name, ver = line.split()[:2]
        tree.add((name, ver.removeprefix("v")))
    tree -= {(PACKAGE, v)}
    listed = {(c.get("name"), c.get("version")) for c in bom.get("components", [])}
    for name, ver in sorted(tree - listed):
        expect(False, f"{path.name}: {name} {ver} (cargo tree -e normal) is missing")
    for name, ver in sorted(listed - tree):
        expect(False, f"{path.name}: {name} {ver} is not in cargo tree -e normal")

    # Each one locked in Cargo.lock with that version and its checksum.
    lock = lock_checksums()
    for c in bom.get("components", []):
        key = (c.get("name"), c.get("version"))
        locked = lock.get(key)
        expect(locked is not None, f"{path.name}: {key[0]} {key[1]} is not in Cargo.lock")
        hashes = {h.get("alg"): h.get("content") for h in c.get("hashes", [])}
        if locked is not None:
            expect(hashes.get("SHA-256") == locked.get("checksum"),
                   f"{path.name}: {key[0]} {key[1]}'s SHA-256 is not Cargo.lock's checksum")
        expect(c.get("purl") == f"pkg:cargo/{key[0]}@{key[1]}",
               f"{path.name}: {key[0]} {key[1]}'s purl is {c.get('purl')}")

    # Every crate reached from the binary through the dependency graph.
    deps = {d["ref"]: d.get("dependsOn", []) for d in bom.get("dependencies", [])}
    seen, stack = set(), [meta.get("bom-ref")]
    while stack:
        ref = stack.pop()
        if ref in seen:
            continue
        seen.add(ref)
        stack.extend(deps.get(ref, []))
    for c in bom.get("components", []):
        expect(c.get("bom-ref") in seen,
               f"{path.name}: {c.get('name')} {c.get('version')} is not reached from {PACKAGE}")
    print(f"  {len(listed)} crates, as cargo tree -e normal lists them ({len(tree)}), each at "
          "its Cargo.lock version and checksum")


def check_chart(path: pathlib.Path, v: str, image: str | None, expect) -> None:
    import tarfile

    import helm_python as helm

    with tarfile.open(path) as t:
        members = t.getnames()
    expect(all(m.startswith("slicelet/") for m in members),
           f"{path.name}: entries outside slicelet/")
    expect("slicelet/Chart.yaml" in members, f"{path.name}: no slicelet/Chart.yaml")
    expect(not any(m.startswith("slicelet/ci/") for m in members),
           f"{path.name}: holds ci/ (.helmignore)")
    chart = helm.Chart.load(path)
    meta = chart.metadata
    expect(meta.get("version") == v and meta.get("appVersion") == v,
           f"{path.name}: version {meta.get('version')}, appVersion {meta.get('appVersion')}")
    repository = chart.values["image"]["repository"]
    want = image or f"{repository}:{v}"
    rendered = chart.render({}, name="slicelet", namespace="slicelet-system")
    images = set()
    for template, doc in rendered.items():
        if not template.endswith(".yaml"):
            continue  # NOTES.txt
        for obj in yaml.safe_load_all(doc):
            if obj and obj.get("kind") == "DaemonSet":
                spec = obj["spec"]["template"]["spec"]
                for c in spec.get("containers", []) + spec.get("initContainers", []):
                    images.add(c["image"])
    expect(images == {want}, f"{path.name}: renders the images {sorted(images)}, not {want}")
    print(f"  rendered from the .tgz by Helm's engine: {len(rendered)} templates, image {want}")


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    sub = parser.add_subparsers(dest="command", required=True)
    sub.add_parser("version")
    sub.add_parser("versions")
    for name in ("chart", "sbom", "check"):
        p = sub.add_parser(name)
        p.add_argument("out", type=pathlib.Path)
        if name == "check":
            p.add_argument("--image", help="the image reference the chart must default to")
    args = parser.parse_args()
    try:
        if args.command == "version":
            print(version())
        elif args.command == "versions":
            check_versions()
        elif args.command == "chart":
            package_chart(args.out.resolve())
        elif args.command == "sbom":
            sbom(args.out.resolve())
        else:
            check(args.out.resolve(), args.image)
    except (ReleaseError, subprocess.CalledProcessError) as e:
        detail = getattr(e, "stderr", None) or ""
        print(f"release: {e}{(chr(10) + detail) if detail else ''}", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
