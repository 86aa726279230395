#!/bin/sh
# Copies the shipped policies, nodes and the test fixtures into the fuzz corpora.
set -eu
cd "$(dirname "$0")"
mkdir -p corpus/policy corpus/node corpus/usage
cp seeds/policy/* ../config/*.yaml corpus/policy/ 2>/dev/null || true
cp ../fixtures/policies/*.yaml corpus/policy/
cp seeds/node/* ../config/nodes/*.yaml corpus/node/ 2>/dev/null || true
cp seeds/usage/* corpus/usage/
